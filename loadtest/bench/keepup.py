"""Keeping up at 78% of capacity: fresh stacks, one after another, Ferry beside Triton alone.

Each run starts a fresh stack as ``ferry up`` would (tritonserver, Redis, a gateway process per
core, one batcher) on the slow backend (t(B) = 50 + 2·B ms) with 2 instances, and at once drives
Ferry with the two-request flow (POST, then GET ``?wait=10``) at 78% of the backend's batched
capacity, Poisson, distinct 2 KB payloads; then Triton alone (its dynamic batcher, delay 0) over
gRPC with the same schedule, on the same Triton. The batcher logs each batch and call
(``ferry.batches`` at DEBUG), and a sampler reads Ferry's queue depth every 100 ms, so each run
reports its batches' sizes and flush reasons, its dispatch gaps and its depth over time.

    .venv/bin/python -m loadtest.bench.keepup --runs 10
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import uvloop

from loadtest.bench.backends import SLOW, Scenario, write_repository
from loadtest.bench.stack import BenchStack
from loadtest.generator import RunResult, run

log = logging.getLogger(__name__)

SHARE = 0.78  # of the batched capacity
SECONDS = 12.0
RUNS = 10
BURN = 0.5  # the second series: a busy loop of this share of one core beside each run
MAX_WAIT_MS = 50.0
BATCH_LOG = "INFO,ferry.batches=DEBUG"  # the batcher's log level: a line per batch and call
WITHIN = 1.2  # a run keeps up when Ferry's p99 is within this factor of Triton alone's
BATCH_LINE = re.compile(r"batch at=(?P<at>[\d.]+) model=\S+ priority=\w+ size=(?P<size>\d+) "
                        r"reason=(?P<reason>\w+) gap_ms=(?P<gap>[-\d.]+) left=(?P<left>\d+) "
                        r"inflight=(?P<inflight>\d+) slots=(?P<slots>\d+)")
CALL_LINE = re.compile(r"call at=(?P<at>[\d.]+) model=\S+ size=(?P<size>\d+) "
                       r"seconds=(?P<seconds>[\d.]+) expected=(?P<expected>[\d.]+)")


@dataclass(frozen=True)
class Batch:
    at: float  # the batcher's monotonic clock
    size: int
    reason: str
    gap_ms: float  # -1: no gap (no work waited when the last call ended)
    left: int  # tasks left boarded after it
    inflight: int
    slots: int


def parse_batches(text: str) -> list[Batch]:
    """The batches of a batcher log written with ``ferry.batches`` at DEBUG."""
    return [Batch(float(m["at"]), int(m["size"]), m["reason"], float(m["gap"]), int(m["left"]),
                  int(m["inflight"]), int(m["slots"])) for m in BATCH_LINE.finditer(text)]


@dataclass
class BatchSummary:
    """What a run's batches looked like, whole and in its first second."""

    count: int = 0
    mean_size: float = 0.0
    first_second_mean: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    gap_p50_ms: float = 0.0
    gap_max_ms: float = 0.0
    min_slots: int = 0

    @classmethod
    def of(cls, batches: list[Batch]) -> BatchSummary:
        if not batches:
            return cls()
        start = batches[0].at
        first = [b.size for b in batches if b.at - start < 1.0]
        gaps = sorted(b.gap_ms for b in batches if b.gap_ms >= 0) or [0.0]
        return cls(len(batches), statistics.fmean(b.size for b in batches),
                   statistics.fmean(first), dict(Counter(b.reason for b in batches)),
                   statistics.median(gaps), gaps[-1], min(b.slots for b in batches))


@dataclass
class RunRecord:
    index: int
    ferry: dict[str, float]
    triton: dict[str, float]
    batches: BatchSummary
    depth: list[tuple[float, int]]  # (seconds from the load's start, unfinished tasks)
    failures: dict[str, int] = field(default_factory=dict)  # Ferry's answers other than SUCCESS

    @property
    def ratio(self) -> float:
        return self.ferry["p99_ms"] / max(self.triton["p99_ms"], 1e-9)

    @property
    def kept_up(self) -> bool:
        return self.ratio <= WITHIN


def figures(result: RunResult) -> dict[str, float]:
    return {"p50_ms": result.p50_ms, "p99_ms": result.p99_ms, "done_rps": result.achieved_rps,
            "failed": float(result.count - result.successes)}


class DepthSampler:
    """Ferry's unfinished tasks (the partitions' stream lengths), every ``period_s``."""

    def __init__(self, stack: BenchStack, period_s: float = 0.1) -> None:
        self.stack = stack
        self.period_s = period_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DepthSampler:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            depth = self.stack.queue_depth()
            self.samples.append((round(time.monotonic() - self._start, 2), depth))


async def one_run(index: int, scenario: Scenario, state: Path, *, rate: float, seconds: float,
                  log_level: str = BATCH_LOG) -> RunRecord:
    """A fresh stack: Ferry at ``rate`` at once, then Triton alone at the same rate."""
    folder = state / f"run-{index}"
    shutil.rmtree(folder, ignore_errors=True)  # a fresh stack: no earlier run's data or logs
    repository = write_repository(folder / "models", [scenario], MAX_WAIT_MS)
    stack = BenchStack(folder, repository, batcher_log_level=log_level)
    stack.start(default_model=scenario.model("ferry-2req"))
    count = int(rate * seconds)
    try:
        with DepthSampler(stack) as sampler:
            ferry = await run("ferry-2req", stack.gateway_url, scenario.model("ferry-2req"), rate,
                              count, seed=100 + index)
        if ferry.successes < ferry.count:  # what the queue holds, for the record
            log.warning("run %d: %d of %d tasks unanswered; Ferry's streams: %s", index,
                        ferry.count - ferry.successes, ferry.count, stack.queue_state())
        stack.wait_idle(30)
        triton = await run("triton", stack.triton_grpc, scenario.model("triton-dyn0"), rate,
                           count, seed=100 + index)
    finally:
        stack.stop()
    batches = parse_batches((folder / "logs" / "batcher.log").read_text())
    failures = {k: v for k, v in ferry.statuses.items() if k != "SUCCESS" and v}
    if failures:
        log.warning("run %d: Ferry's answers other than SUCCESS: %s", index, failures)
    return RunRecord(index, figures(ferry), figures(triton), BatchSummary.of(batches),
                     sampler.samples, failures)


HEADING = "## Keeping up at 78% of capacity (ten fresh stacks)"
METHOD = (
    "Each run is a fresh stack (tritonserver, Redis, a gateway process per core, one batcher) "
    "on the slow backend, t(B) = 50 + 2·B ms, 2 instances (719/s at full batches), loaded at "
    "once at 78% of that with Poisson arrivals and distinct 2 KB payloads for 12 s: Ferry with "
    "the two-request flow (POST, then GET ?wait=10), then Triton alone (its dynamic batcher, "
    "delay 0) over gRPC with the same schedule on the same Triton. Batches come from the "
    "batcher's `ferry.batches` log; max depth is the most unfinished tasks in Ferry's streams, "
    "sampled every 100 ms; the dispatch gap runs from a call's end, with work boarded, to the "
    "next batch leaving. A run keeps up when Ferry's p99 is within 1.2 times Triton alone's.")


def table(records: list[RunRecord], rate: float) -> list[str]:
    """The runs side by side, with the batches behind each of Ferry's."""
    lines = ["| run | Ferry p50 / p99 ms | Ferry done/s | Triton alone p50 / p99 ms | "
             "p99 ratio | mean batch (1st s) | flushes full/wait/adaptive/freed | "
             "dispatch gap p50 / max ms | max depth |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        reasons, b = r.batches.reasons, r.batches
        depth = max((d for _, d in r.depth), default=0)
        flushes = "/".join(str(reasons.get(k, 0)) for k in ("full", "wait", "adaptive", "freed"))
        lines.append(
            f"| {r.index} | {r.ferry['p50_ms']:.0f} / {r.ferry['p99_ms']:.0f} | "
            f"{r.ferry['done_rps']:.0f} | {r.triton['p50_ms']:.0f} / {r.triton['p99_ms']:.0f} | "
            f"{r.ratio:.2f} | {b.mean_size:.1f} ({b.first_second_mean:.1f}) | {flushes} | "
            f"{b.gap_p50_ms:.1f} / {b.gap_max_ms:.0f} | {depth} |")
    kept = sum(r.kept_up for r in records)
    ratios = sorted(r.ratio for r in records)
    lines += ["", f"Offered {rate:.0f}/s. Ferry's p99 within {WITHIN} times Triton alone's in "
                  f"**{kept} of {len(records)}** runs; p99 ratio median "
                  f"{statistics.median(ratios):.2f}, worst {ratios[-1]:.2f}." if ratios else ""]
    return lines


def section(records: list[RunRecord], rate: float, note: str,
            burnt: list[RunRecord] | None = None) -> list[str]:
    lines = [HEADING, "", note + " " + METHOD, "", *table(records, rate)]
    if burnt:
        lines += ["", f"With a busy loop of {BURN:g} of a core beside each run (a process that "
                      "spins, then sleeps, every 10 ms: a heavier client or a neighbour on the "
                      "node; `--burn`), in fresh stacks again:", "", *table(burnt, rate)]
    return lines


def offered(share: float = SHARE) -> float:
    return round(share * SLOW.batched_capacity(2))


class Burner:
    """A busy loop in a process of its own at ``share`` of one core (0: none), standing for a
    client or a neighbour that costs more CPU than the benchmark's generator."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Burner:
        if self.share > 0:
            busy, period = self.share * 0.01, 0.01
            code = ("import time\nwhile True:\n    t = time.perf_counter()\n"
                    f"    while time.perf_counter() - t < {busy}: pass\n"
                    f"    time.sleep({period - busy})\n")
            self.proc = subprocess.Popen([sys.executable, "-c", code])  # noqa: S603 (ours)
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


async def keepup(runs: int, seconds: float, share: float, state: Path, *,
                 log_level: str = BATCH_LOG, burn: float = 0.0) -> list[RunRecord]:
    scenario = Scenario(SLOW, 2)
    rate = offered(share)
    records = []
    for index in range(1, runs + 1):
        with Burner(burn):
            record = await one_run(index, scenario, state, rate=rate, seconds=seconds,
                                   log_level=log_level)
        log.info("run %d: Ferry p99 %.0f ms, Triton alone %.0f ms, mean batch %.1f",
                 index, record.ferry["p99_ms"], record.triton["p99_ms"],
                 record.batches.mean_size)
        records.append(record)
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--share", type=float, default=SHARE, help="of the batched capacity")
    parser.add_argument("--log-level", default=BATCH_LOG,
                        help="the batcher's FERRY_LOG_LEVEL (INFO for a tree without "
                             "ferry.batches)")
    parser.add_argument("--burn", type=float, default=0.0,
                        help="a busy loop beside the run, this share of one core (0-1)")
    parser.add_argument("--state", default="", help="logs and raw records (default: a temp dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    state = Path(args.state or tempfile.mkdtemp(prefix="ferry-keepup-")).resolve()
    records = uvloop.run(keepup(args.runs, args.seconds, args.share, state,
                                log_level=args.log_level, burn=args.burn))
    (state / "keepup.json").write_text(json.dumps([asdict(r) for r in records]))
    print("\n".join(table(records, offered(args.share))))
    print(f"(records and logs in {state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
