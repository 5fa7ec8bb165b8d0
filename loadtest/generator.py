"""Open-loop load: sends on a schedule drawn in advance, whatever the server does.

Arrival times are drawn before the run (Poisson, or a constant rate) from a seed, and each
request's latency counts from its *scheduled* time, so a slow server cannot slow the client down
and hide its own queueing (no coordinated omission). Latencies go into an HdrHistogram (1 µs to
60 s, 3 significant digits). A run is bounded in count and in time: what has not finished
``drain_s`` after the last scheduled send counts as a timeout. Targets are loopback only.

    .venv/bin/python -m loadtest.generator --flow ferry-1req --url http://127.0.0.1:8000 \\
        --model sim --rate 400 --count 4000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import resource
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

import uvloop
from hdrh.histogram import HdrHistogram

from loadtest.flows import (
    FerryFlow,
    Flow,
    PeerFlow,
    PlainFerryFlow,
    PlainTritonFlow,
    TritonFlow,
)

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
FLOWS = ("ferry-2req", "ferry-1req", "triton", "peer", "ferry-plain", "triton-plain")
MAX_COUNT = 200_000
LATE_MS = 2.0  # a send this far behind its schedule means the generator is falling behind


def schedule(rate: float, count: int, *, seed: int, poisson: bool = True) -> list[float]:
    """Send times in seconds from the start: Poisson arrivals (exponential gaps) or constant."""
    rng = random.Random(seed)
    times, at = [], 0.0
    for _ in range(count):
        times.append(at)
        at += rng.expovariate(rate) if poisson else 1.0 / rate
    return times


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class RunResult:
    """One run's outcome; latencies in milliseconds, from each request's scheduled send."""

    flow: str
    offered_rps: float
    count: int
    elapsed_s: float
    achieved_rps: float
    statuses: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    generator_cpu_s: float
    late_sends: int  # sends more than LATE_MS behind schedule
    histogram: str = field(repr=False)  # HdrHistogram, base64 of its compressed encoding

    @property
    def successes(self) -> int:
        return self.statuses.get("SUCCESS", 0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Trace:
    """Every request's scheduled send and its end (answered or failed), in seconds from the
    run's start; an end of None: it never ended. Filled by ``run`` when it is given one (the
    fault rows read the backlog over time from it)."""

    start: float = 0.0  # time.perf_counter() at the run's start (set when it ends)
    spans: list[tuple[float, float | None]] = field(default_factory=list)


def make_flow(name: str, url: str, model: str) -> Flow:
    parts = urlparse(url if "://" in url else f"grpc://{url}")
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if host not in LOOPBACK_HOSTS:
        raise ValueError("load goes to loopback addresses only")
    if name == "triton":
        return TritonFlow(f"{host}:{port}", model)
    if name == "peer":
        return PeerFlow(host, port)
    if name == "ferry-plain":
        return PlainFerryFlow(host, port, model)
    if name == "triton-plain":
        return PlainTritonFlow(host, port, model)
    return FerryFlow(host, port, model, prefer_wait=name == "ferry-1req")


Send = Callable[[int, float], Coroutine[Any, Any, None]]


async def drive(times: list[float], start: float, send: Send) -> tuple[list[asyncio.Task[None]],
                                                                      int]:
    """Each send at its scheduled time from ``start`` (perf_counter), whatever the server
    does; the sends' tasks, and how many left more than LATE_MS late."""
    tasks: list[asyncio.Task[None]] = []
    late = 0
    for index, offset in enumerate(times):
        scheduled = start + offset
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif -delay * 1000 > LATE_MS:
            late += 1
        tasks.append(asyncio.create_task(send(index, scheduled)))
    return tasks, late


async def run(flow_name: str, url: str, model: str, rate: float, count: int, *,
              seed: int = 1, poisson: bool = True, drain_s: float = 30.0,
              trace: Trace | None = None) -> RunResult:
    """Drive one flow open-loop at ``rate`` for ``count`` requests (each one's send and end
    into ``trace``, if given)."""
    if not 0 < count <= MAX_COUNT or rate <= 0:
        raise ValueError(f"count must be 1..{MAX_COUNT} and rate positive")
    flow = make_flow(flow_name, url, model)
    histogram = HdrHistogram(1, 60_000_000, 3)
    statuses: Counter[str] = Counter()
    times = schedule(rate, count, seed=seed, poisson=poisson)
    cpu_before = cpu_seconds()
    start = time.perf_counter() + 0.05
    late = 0
    last_done = start

    finished: list[float] = []  # when each success came, from the start
    ended: dict[int, float] = {}  # when each request ended, answered or not, from the start

    async def one(index: int, scheduled: float) -> None:
        nonlocal last_done
        try:
            outcome = await flow(index)
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            outcome = type(exc).__name__
        done = time.perf_counter()
        statuses[outcome] += 1
        ended[index] = done - start
        if outcome == "SUCCESS":
            histogram.record_value(max(1, int((done - scheduled) * 1e6)))
            last_done = max(last_done, done)
            finished.append(done - start)

    tasks: list[asyncio.Task[None]] = []
    try:
        tasks, late = await drive(times, start, one)
        _, unfinished = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
        for task in unfinished:
            task.cancel()
        statuses["TIMEOUT"] += len(unfinished)
    finally:
        await flow.close()
    _fill(trace, start, times, ended)
    cpu = cpu_seconds() - cpu_before
    q = histogram.get_value_at_percentile
    elapsed = max(last_done - start, times[-1] if times else 0.0, 1e-9)
    return RunResult(
        flow=flow_name, offered_rps=rate, count=count, elapsed_s=round(elapsed, 3),
        achieved_rps=round(served_rate(rate, times, finished), 1), statuses=dict(statuses),
        p50_ms=q(50) / 1000, p90_ms=q(90) / 1000, p99_ms=q(99) / 1000, p999_ms=q(99.9) / 1000,
        max_ms=histogram.get_max_value() / 1000, generator_cpu_s=round(cpu, 3), late_sends=late,
        histogram=base64.b64encode(histogram.encode()).decode("ascii"))


def _fill(trace: Trace | None, start: float, times: list[float], ended: dict[int, float]
          ) -> None:
    if trace is not None:
        trace.start = start
        trace.spans = [(offset, ended.get(index)) for index, offset in enumerate(times)]


def served_rate(rate: float, times: list[float], done: list[float]) -> float:
    """What the system served, from the middle 80% of the sending window.

    Answers in that window divided by sends scheduled in it, times the offered rate: about the
    offered rate when the system keeps up (whatever the Poisson schedule's own noise), and the
    rate it can sustain when it cannot (answers then come at its pace, not the offered one).
    Short runs without enough sends in the window fall back to the share of successes.
    """
    if not times or not done:
        return 0.0
    low, high = 0.1 * times[-1], 0.9 * times[-1]
    sent = sum(1 for t in times if low <= t <= high)
    if sent < 20:
        return rate * len(done) / len(times)
    answered = sum(1 for t in done if low <= t <= high)
    return rate * answered / sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flow", choices=FLOWS, default="ferry-2req")
    parser.add_argument("--url", default="http://127.0.0.1:8000",
                        help="Ferry's gateway, Triton's gRPC host:port for --flow triton, or "
                             "a peer's http://host:port for --flow peer")
    parser.add_argument("--model", default="sim")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--count", type=int, default=2000, help=f"requests (max {MAX_COUNT})")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--constant", action="store_true", help="constant rate, not Poisson")
    parser.add_argument("--drain-s", type=float, default=30.0,
                        help="after the last send, how long to wait for answers")
    parser.add_argument("--histogram", action="store_true", help="include the encoded histogram")
    args = parser.parse_args()
    try:
        result = uvloop.run(run(args.flow, args.url, args.model, args.rate, args.count,
                                seed=args.seed, poisson=not args.constant,
                                drain_s=args.drain_s))
    except ValueError as exc:
        parser.error(str(exc))
    document = result.to_json()
    if not args.histogram:
        document.pop("histogram")
    print(json.dumps(document))


if __name__ == "__main__":
    main()
