"""The measurements: each system at increasing offered rates until it saturates.

A point is one open-loop run at one rate: the generator's latencies and outcomes, Triton's own
statistics over the run (executions, mean executed batch, busy fraction), and the CPU each
process spent, per inference. Runs are sequential; after a run that left work queued, the next
waits for Ferry to drain it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtest.bench.backends import Scenario
from loadtest.bench.cpu import CpuMeter
from loadtest.bench.peers import PEERS, Peer
from loadtest.bench.stack import BenchStack
from loadtest.generator import RunResult, cpu_seconds, run

log = logging.getLogger(__name__)

FERRY_SYSTEMS = ("ferry-1req", "ferry-2req")
TRITON_SYSTEMS = ("triton-dyn0", "triton-dyn50", "triton-unbatched")
SYSTEMS = FERRY_SYSTEMS + TRITON_SYSTEMS
PEER_SYSTEMS = PEERS  # each measured while it alone runs beside Triton (``Sweep.peer``)
FERRY_PROCESSES = ("gateway", "batcher", "redis")
PEER_GROUP = "peer"  # a peer's whole process tree; "peer/<name>" its processes by name
LATE_FRACTION = 0.05  # more sends than this behind schedule: the generator is the bottleneck


@dataclass
class TritonCounts:
    executions: int = 0
    inferences: int = 0
    busy_ns: int = 0

    def minus(self, other: TritonCounts) -> TritonCounts:
        return TritonCounts(self.executions - other.executions,
                            self.inferences - other.inferences, self.busy_ns - other.busy_ns)


@dataclass
class Point:
    """One run of one system at one offered rate."""

    scenario: str
    system: str
    offered_rps: float
    run: dict[str, Any]
    mean_batch: float
    busy_fraction: float
    cpu_us: dict[str, float] = field(default_factory=dict)  # per successful inference
    generator_us: float = 0.0  # the generator's own CPU per request sent
    generator_bound: bool = False
    round: int = 0  # 0: the sweep's own run; 1, 2, ...: repeats for the headline medians

    @property
    def achieved(self) -> float:
        return float(self.run["achieved_rps"])

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.run["statuses"].items() if status != "SUCCESS")

    def pct(self, name: str) -> float:
        return float(self.run[name])

    @property
    def ferry_cpu_us(self) -> float:
        return sum(self.cpu_us.get(p, 0.0) for p in FERRY_PROCESSES)

    @property
    def ferry_split(self) -> str:
        """Ferry's CPU per inference by process: "gateway + batcher + Redis" in µs."""
        return " + ".join(f"{self.cpu_us.get(name, 0.0):,.0f}" for name in FERRY_PROCESSES)

    @property
    def serving_cpu_us(self) -> float:
        """CPU per inference of what serves in front of Triton: Ferry's three processes, or a
        peer's whole tree (0 for Triton alone)."""
        return self.cpu_us.get(PEER_GROUP, 0.0) if self.system in PEER_SYSTEMS else (
            self.ferry_cpu_us if self.system in FERRY_SYSTEMS else 0.0)

    def saturated(self) -> bool:
        count = int(self.run["count"])
        return (self.achieved < 0.9 * self.offered_rps or self.errors > 0.01 * count
                or self.pct("p99_ms") > 2000 or self.generator_bound)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class TritonStats:
    """Triton's per-model statistics (cumulative), over the aio stub: the generator's loop."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    async def counts(self, model: str) -> TritonCounts:
        reply = await self.stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=model),
                                                timeout=10)
        counts = TritonCounts()
        for stats in reply.model_stats:
            for row in stats.batch_stats:
                counts.executions += row.compute_infer.count
                counts.inferences += row.batch_size * row.compute_infer.count
                counts.busy_ns += row.compute_infer.ns
        return counts

    async def close(self) -> None:
        await self.channel.close()


def duration_s(rate: float, quick: bool) -> float:
    """Long enough for a few hundred samples at low rates, short enough for the time budget."""
    return 1.0 if quick else min(6.0, max(3.0, 600.0 / rate))


@dataclass
class Sweep:
    stack: BenchStack
    stats: TritonStats
    quick: bool = False
    points: list[Point] = field(default_factory=list)
    seed: int = 1
    peer: Peer | None = None  # the peer running now, if any (its systems need it)

    async def system(self, scenario: Scenario, system: str, rates: list[float]) -> None:
        """Ascending rates until the system saturates (that point is kept)."""
        for rate in rates:
            point = await self.measure(scenario, system, rate)
            self.points.append(point)
            log.info("%-8s %-16s %6.0f/s -> %7.1f/s  p50 %7.1f  p99 %8.1f ms  ferry %6.0f us  "
                     "gen %5.0f us%s", scenario.name, system, rate, point.achieved,
                     point.pct("p50_ms"), point.pct("p99_ms"), point.ferry_cpu_us,
                     point.generator_us, "  saturated" if point.saturated() else "")
            if point.saturated():
                return

    async def repeat(self, scenario: Scenario, systems: tuple[str, ...],
                     rates: tuple[float, ...], rounds: int) -> None:
        """More runs of the headline points, interleaved across systems, for medians."""
        for number in range(1, rounds + 1):
            for rate in rates:
                for system in systems:
                    point = await self.measure(scenario, system, rate)
                    point.round = number
                    self.points.append(point)

    async def warm_up(self, scenario: Scenario, system: str, count: int = 10) -> None:
        """A few requests, not reported: connections, caches and model specs get ready (well
        below any system's capacity, so no backlog is left for the first measured run)."""
        await self.measure(scenario, system, 10.0, count=count)

    async def measure(self, scenario: Scenario, system: str, rate: float,
                      count: int = 0) -> Point:
        model = scenario.model(system)
        ferry = system in FERRY_SYSTEMS
        flow, url, groups = self._target(system)
        count = count or max(1, int(rate * duration_s(rate, self.quick)))
        meter = CpuMeter(groups)
        self.seed += 1
        before, cpu_before, gen_before = (await self.stats.counts(model), meter.snapshot(),
                                          cpu_seconds())
        result: RunResult = await run(flow, url, model, rate, count, seed=self.seed,
                                      drain_s=15.0)
        gen_cpu = cpu_seconds() - gen_before
        cpu = CpuMeter.delta(cpu_before, meter.snapshot())
        counts = (await self.stats.counts(model)).minus(before)
        if ferry and not self.stack.wait_idle():
            log.warning("Ferry still had work queued 60 s after a run")
        done = max(1, result.successes)
        elapsed = max(result.elapsed_s, 1e-9)
        return Point(
            scenario=scenario.name, system=system, offered_rps=rate, run=result.to_json(),
            mean_batch=counts.inferences / counts.executions if counts.executions else 0.0,
            busy_fraction=counts.busy_ns / 1e9 / (elapsed * scenario.instances),
            cpu_us={name: seconds * 1e6 / done for name, seconds in cpu.items()},
            generator_us=gen_cpu * 1e6 / count,
            generator_bound=result.late_sends > LATE_FRACTION * count)


    def _target(self, system: str) -> tuple[str, str, dict[str, list[int]]]:
        """The generator's flow and URL for ``system``, and the process groups to meter."""
        groups = dict(self.stack.pids)
        if system in FERRY_SYSTEMS:
            return system, self.stack.gateway_url, groups
        if system in PEER_SYSTEMS:
            assert self.peer is not None and self.peer.name == system, f"{system} is not running"
            return "peer", self.peer.url, groups | self.peer.groups(PEER_GROUP)
        return "triton", self.stack.triton_grpc, groups


def by(points: list[Point], scenario: str, system: str) -> Iterator[Point]:
    """The sweep's own points (not the repeats)."""
    return (p for p in points if p.scenario == scenario and p.system == system and not p.round)


def at(points: list[Point], scenario: str, system: str, rate: float) -> Point | None:
    return next((p for p in by(points, scenario, system) if p.offered_rps == rate), None)


def runs_at(points: list[Point], scenario: str, system: str, rate: float) -> list[Point]:
    """Every run at that point, repeats included."""
    return [p for p in points if p.scenario == scenario and p.system == system
            and p.offered_rps == rate]


def ceiling(points: list[Point], scenario: str, system: str, p99_ms: float = 100.0) -> float:
    """The highest offered rate served in full (≥ 98%), without errors, with p99 under
    ``p99_ms``."""
    good = [p.offered_rps for p in by(points, scenario, system)
            if p.achieved >= 0.98 * p.offered_rps and p.errors == 0
            and p.pct("p99_ms") < p99_ms and not p.generator_bound]
    return max(good, default=0.0)
