"""Arrival times on a simulated clock: Poisson, bursty (a Markov-modulated Poisson process) or
a recorded trace. Deterministic under a seed."""

from __future__ import annotations

import math
import random
from pathlib import Path

from ferry.errors import ConfigError

KINDS = ("poisson", "bursty", "trace")


def poisson(qps: float, seconds: float, seed: int = 0) -> list[float]:
    """Exponential gaps at ``qps`` for ``seconds``."""
    if qps <= 0:
        return []
    draw, log = random.Random(seed).random, math.log
    times: list[float] = []
    # rng.expovariate(qps), written out: a run draws a gap per task, and this is the cost of
    # the call (and the same numbers, whatever Python's random module does in later versions)
    now = -log(1.0 - draw()) / qps
    while now < seconds:
        times.append(now)
        now += -log(1.0 - draw()) / qps
    return times


def bursty(qps: float, seconds: float, seed: int = 0, *, factor: float = 4.0,
           burst_s: float = 1.0, calm_s: float = 4.0) -> list[float]:
    """Two states: bursts at ``factor`` times the calm rate, of mean length ``burst_s``, between
    calm spells of mean length ``calm_s`` (exponential); rates chosen so the mean is ``qps``."""
    if qps <= 0:
        return []
    rng = random.Random(seed)
    calm_rate = qps * (burst_s + calm_s) / (factor * burst_s + calm_s)
    times: list[float] = []
    now, bursting = 0.0, False
    while now < seconds:
        spell = rng.expovariate(1.0 / (burst_s if bursting else calm_s))
        end = min(seconds, now + spell)
        rate = calm_rate * (factor if bursting else 1.0)
        at = now + rng.expovariate(rate)
        while at < end:
            times.append(at)
            at += rng.expovariate(rate)
        now, bursting = end, not bursting
    return times


def trace(path: Path, qps: float | None = None, seconds: float | None = None) -> list[float]:
    """Arrival times (seconds, one per line, any origin) from a file, shifted to start at 0 and,
    with ``qps``, stretched or squeezed to that mean rate; cut at ``seconds``."""
    try:
        raw = sorted(float(line) for line in path.read_text().split() if line.strip())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read arrival trace {path}: {exc}") from exc
    if len(raw) < 2:
        raise ConfigError(f"arrival trace {path} needs at least two arrival times")
    times = [t - raw[0] for t in raw]
    if qps:
        scale = (len(times) - 1) / times[-1] / qps if times[-1] > 0 else 1.0
        times = [t * scale for t in times]
    return [t for t in times if seconds is None or t < seconds]


def generate(kind: str, qps: float, seconds: float, seed: int = 0,
             trace_file: Path | None = None) -> list[float]:
    if kind == "poisson":
        return poisson(qps, seconds, seed)
    if kind == "bursty":
        return bursty(qps, seconds, seed)
    if kind == "trace":
        if trace_file is None:
            raise ConfigError("--arrivals trace needs a file of arrival times")
        return trace(trace_file, qps, seconds)
    raise ConfigError(f"arrivals must be one of {', '.join(KINDS)}, not {kind!r}")
