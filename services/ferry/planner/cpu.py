"""What Ferry's own processes cost in CPU, per task and per batch, as ``make bench`` measures it.

Each process is a server that does one thing at a time (a Python event loop): a gateway worker
admits a task and later answers it, the batcher reads it, sends its batch and settles it, Redis
runs the admission and completion scripts. Their CPU per task falls as batches grow (a call, a
Lua step and a wake-up are shared by a batch), so each is fitted as ``task + batch / B`` by
least squares over make bench's rows (CPU per inference at each rate, against the mean batch B
Triton saw). The simulation (``ferry.planner.simulate``) queues every task's work on these
servers, so a deployment saturates by CPU as well as by GPU, and the batcher's own work between
two calls (the gap in which the GPU waits for it) lengthens every cycle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ferry.errors import ConfigError
from ferry.planner.costs import read_json

PROCESSES = ("gateway", "batcher", "redis")
BUSY = 0.6  # the busiest a process is planned to be at the design load: past it, bursts queue


@dataclass(frozen=True)
class CpuCost:
    """CPU seconds: each process's part per task and per batch (shared by the batch's tasks)."""

    gateway_task_s: float = 0.0
    gateway_batch_s: float = 0.0
    batcher_task_s: float = 0.0
    batcher_batch_s: float = 0.0
    redis_task_s: float = 0.0
    redis_batch_s: float = 0.0

    def __post_init__(self) -> None:
        if any(getattr(self, f.name) < 0 for f in fields(self)):
            raise ConfigError("CPU costs must be >= 0")

    def per_task(self, process: str, batch: float) -> float:
        """One process's CPU seconds per task at mean batch ``batch``."""
        task, per_batch = getattr(self, f"{process}_task_s"), getattr(self, f"{process}_batch_s")
        return float(task + per_batch / max(1.0, batch))

    def total(self, batch: float) -> float:
        return sum(self.per_task(p, batch) for p in PROCESSES)

    def scaled(self, factor: float) -> CpuCost:
        """Every cost times ``factor`` (work on cores that other work keeps busy)."""
        return CpuCost(**{f.name: getattr(self, f.name) * factor for f in fields(self)})

    def processes(self, process: str, qps: float, batch: float, busy: float = BUSY) -> int:
        """How many processes of a kind keep each at most ``busy`` at ``qps`` (batches of
        ``batch``)."""
        return max(1, math.ceil(qps * self.per_task(process, batch) / busy))

    def to_json(self) -> dict[str, float]:
        return {f.name.removesuffix("_s") + "_us": getattr(self, f.name) * 1e6
                for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuCost:
        try:
            return cls(**{f.name: float(data[f.name.removesuffix("_s") + "_us"]) / 1e6
                          for f in fields(cls)})
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a CPU cost file (gateway_task_us...): {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> CpuCost:
        return cls.from_json(read_json(path, "CPU cost file"))


@dataclass(frozen=True)
class CpuSample:
    """One measured rate: the mean batch and each process's CPU seconds per task."""

    batch: float
    seconds: Mapping[str, float]


def fit(samples: Sequence[CpuSample]) -> CpuCost:
    """``task + batch / B`` for each process, least squares over the samples (both terms kept
    at least 0)."""
    if not samples:
        raise ConfigError("no CPU measurements to fit")
    values: dict[str, float] = {}
    for process in PROCESSES:
        points = [(1.0 / max(1.0, s.batch), s.seconds[process]) for s in samples]
        task, per_batch = _line(points)
        values[f"{process}_task_s"], values[f"{process}_batch_s"] = task, per_batch
    return CpuCost(**values)


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Intercept and slope of y on x, both >= 0 (a flat line through the mean when x does not
    vary, or when the slope would be negative)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var_x if var_x > 0 else 0.0
    if slope <= 0:
        return mean_y, 0.0
    intercept = mean_y - slope * mean_x
    if intercept < 0:  # through the origin instead
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return intercept, slope


# make bench at 0af4c47 (2026-11-29, an AMD EPYC host of 2 cores; infer calls over HTTP,
# admissions carried many to a Redis call, one completion per batch per Redis node): the fast
# backend's rates below saturation, 1 and 2 instances, one request per task; `make plan-check`
# prints the fit of the BENCHMARKS.md it reads (PLANNER.md). `ferry plan size` uses it unless
# given --cpu-costs. The fit before it (EARLIER_CPU) was about half, with the host. The GPU kit's
# H200 runs spent 1.4-2.2 ms per inference in all (gateway, batchers, Redis; BENCHMARKS.md "On
# a GPU"), nearer this fit (1.1-1.5 ms at batches of 20 down to 8) than the earlier one
# (0.7-0.8 ms).
BENCH_CPU = CpuCost(gateway_task_s=611e-6, gateway_batch_s=1_213e-6, batcher_task_s=134e-6,
                    batcher_batch_s=2_461e-6, redis_task_s=164e-6, redis_batch_s=728e-6)
# What a bare HTTP exchange (uvicorn answering {} at once) cost at 400/s in the run BENCH_CPU was
# fitted over (BENCHMARKS.md, "What this machine charges"): the machine's price of a wake-up,
# against which `ferry plan size --cpu-scale` scales the costs to another node.
BENCH_EXCHANGE_US = 200.0
# The fit before BENCH_CPU: make bench at 144f6cc (2026-11-27, an Intel host of 2 cores where a
# bare exchange cost 100 us at 400/s). The planner tests whose figures were taken with it pin it.
EARLIER_CPU = CpuCost(gateway_task_s=320e-6, gateway_batch_s=552e-6, batcher_task_s=131e-6,
                      batcher_batch_s=1_055e-6, redis_task_s=128e-6, redis_batch_s=332e-6)
