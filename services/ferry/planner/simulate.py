"""A discrete-event simulation of a Ferry deployment, driven by the code the batcher runs.

Each simulated batcher keeps what the real one keeps for a model (``ferry.batcher.worker``): a
boarding queue, the arrival rate (``ArrivalRate``), the fitted t(B) of the calls it made
(``BatchCost``), and the window of batches it may have at Triton (``Window``, AIMD on slow calls,
at most ``inflight``). It asks ``BatchPolicy.plan`` (the same object, fed the simulated clock)
what leaves, whenever a request boards, a batch returns, or the plan asked to look again. Batches
go to a pool of Triton instances (FIFO when every instance is busy: several batchers may share
them), each taking t(B) plus the fit's jitter. Requests are spread over batchers at random, as
partitions spread them. Admission: above ``max_backlog`` unfinished tasks, arrivals are refused
(429), as the gateway does. A task's latency is its time to its result, plus ``overhead_s``
(Ferry's own hops: gateway, Redis, wake-up).

What it leaves out: CPU limits of gateways and batchers (sized separately), Redis, network
jitter, and priorities (one lane). The batcher's read parking only delays reads until a batch
could leave, which changes no batch; it is not modelled.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ferry.batching.estimators import ArrivalRate, BatchCost, Window
from ferry.batching.policy import Backend, BatchPolicy, Lane, Waiting
from ferry.errors import ConfigError
from ferry.planner.costs import CostModel

LANE = Lane("model")
_DONE, _WAKE = 0, 1


@dataclass(frozen=True)
class Deployment:
    """What is being sized: GPU instances, batchers, and the batching settings."""

    instances: int
    max_batch: int = 64
    max_wait_s: float = 0.05
    batchers: int = 1
    inflight: int = 0  # batches per batcher at Triton at once; 0: instances (Ferry's default)
    adaptive: bool = True
    overhead_s: float = 0.0
    max_backlog: int = 0  # 0: no admission limit
    slo_s: float = 0.0  # the batcher's SLO (FERRY_SLO_MS): 0, none

    def __post_init__(self) -> None:
        if self.instances < 1 or self.batchers < 1 or self.max_batch < 1:
            raise ConfigError("instances, batchers and max_batch must be at least 1")
        if self.max_wait_s < 0 or self.overhead_s < 0 or self.slo_s < 0:
            raise ConfigError("max_wait, overhead and slo must be >= 0")

    @property
    def window(self) -> int:
        return self.inflight or self.instances


@dataclass(frozen=True)
class Outcome:
    """What a simulated run measured (after its warm-up)."""

    offered: int
    served: int
    refused: int
    seconds: float
    p50_s: float
    p90_s: float
    p99_s: float
    p999_s: float
    mean_s: float
    utilisation: float  # busy instance-time / available instance-time
    mean_batch: float
    flushes: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0  # still queued or at Triton when arrivals stopped (counted, not lost)
    finished_s: float = 0.0  # when the last task was answered (the simulated clock)

    @property
    def throughput(self) -> float:
        return self.served / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Batcher:
    index: int
    window: Window
    queue: deque[float] = field(default_factory=deque)
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    cost: BatchCost = field(default_factory=BatchCost)
    in_flight: int = 0
    wake_at: float = math.inf


@dataclass
class _Batch:
    batcher: _Batcher
    arrivals: list[float]
    sent_at: float


class Simulation:
    """One run: ``Simulation(cost, deployment, seed).run(arrival_times)``."""

    def __init__(self, cost: CostModel, deployment: Deployment, seed: int = 0,
                 warmup_s: float | None = None) -> None:
        self.cost = cost
        self.deployment = deployment
        self.policy = BatchPolicy(deployment.max_batch, deployment.max_wait_s,
                                  adaptive=deployment.adaptive)
        self.rng = random.Random(seed)
        self.warmup_s = warmup_s
        self.batchers = [_Batcher(i, Window(deployment.window))
                         for i in range(deployment.batchers)]
        self.free = deployment.instances
        self.at_triton: deque[_Batch] = deque()  # waiting for an instance
        self.events: list[tuple[float, int, int, _Batch | _Batcher]] = []
        self.seq = 0
        self.latencies: list[float] = []
        self.flushes: Counter[str] = Counter()
        self.batch_sizes = 0
        self.batches = 0
        self.busy_s = 0.0
        self.backlog = 0
        self.refused = 0
        self.offered = 0
        self.last_answer = 0.0

    def run(self, arrivals: Sequence[float]) -> Outcome:
        """Simulate until every admitted task is answered; statistics skip the warm-up."""
        end = arrivals[-1] if arrivals else 0.0
        warmup = self.warmup_s if self.warmup_s is not None else 0.1 * end
        self.warmup_s = warmup
        for now in arrivals:
            while self.events and self.events[0][0] <= now:
                self._next_event()
            self._arrive(now)
        unfinished = self.backlog
        while self.events:
            self._next_event()
        return self._outcome(max(0.0, end - warmup), unfinished)

    # -- events ---------------------------------------------------------------------------------

    def _arrive(self, now: float) -> None:
        measured = now >= (self.warmup_s or 0.0)
        self.offered += measured
        limit = self.deployment.max_backlog
        if limit and self.backlog >= limit:
            self.refused += measured
            return
        self.backlog += 1
        batcher = self.batchers[self.rng.randrange(len(self.batchers))]
        batcher.queue.append(now)
        batcher.rate.add(now)
        self._plan(batcher, now)

    def _next_event(self) -> None:
        now, _, kind, item = heapq.heappop(self.events)
        if kind == _DONE:
            assert isinstance(item, _Batch)
            self._done(item, now)
        else:
            assert isinstance(item, _Batcher)
            if now >= item.wake_at:
                item.wake_at = math.inf
                self._plan(item, now)

    def _done(self, batch: _Batch, now: float) -> None:
        self.free += 1
        if self.at_triton:
            self._start(self.at_triton.popleft(), now)
        batcher, size = batch.batcher, len(batch.arrivals)
        batcher.in_flight -= 1
        seconds = now - batch.sent_at  # what the batcher sees: Triton's queue included
        batcher.window.observe(seconds, batcher.cost.time_at(size) if batcher.cost.settled
                               else 0.0)
        batcher.cost.add(size, seconds)
        self.backlog -= size
        answered = now + self.deployment.overhead_s
        self.last_answer = answered
        warmup = self.warmup_s or 0.0
        self.latencies.extend(answered - a for a in batch.arrivals if a >= warmup)
        self._plan(batcher, now)

    # -- the batcher's decisions ----------------------------------------------------------------

    def _plan(self, batcher: _Batcher, now: float) -> None:
        """Ask the policy, as the batcher's dispatcher does, while a batch may start."""
        free = batcher.window.allowed - batcher.in_flight
        if free <= 0 or not batcher.queue:
            return  # nothing can leave: the next return or arrival asks again
        queue = batcher.queue
        slo = self.deployment.slo_s
        waiting = Waiting(LANE, len(queue), queue[0], queue[-1], self.deployment.max_batch,
                          due=queue[0] + slo if slo else None)
        backend = Backend(free=free, rate=batcher.rate.at(now), fixed_s=batcher.cost.fixed_s,
                          per_item_s=batcher.cost.per_item_s, slots=batcher.window.allowed,
                          late_s=batcher.cost.late_s)
        plan = self.policy.plan([waiting], now, {LANE.model: backend})
        for departure in plan.flush:
            riders = [queue.popleft() for _ in range(departure.size)]
            self.flushes[departure.reason.value] += 1
            self._send(_Batch(batcher, riders, now), now)
        if plan.wake_in is not None and plan.wake_in > 0 and now + plan.wake_in < batcher.wake_at:
            batcher.wake_at = now + plan.wake_in
            self._push(batcher.wake_at, _WAKE, batcher)

    def _send(self, batch: _Batch, now: float) -> None:
        batch.batcher.in_flight += 1
        self.batches += 1
        self.batch_sizes += len(batch.arrivals)
        if self.free > 0:
            self._start(batch, now)
        else:
            self.at_triton.append(batch)

    def _start(self, batch: _Batch, now: float) -> None:
        self.free -= 1
        seconds = self.cost.sample(len(batch.arrivals), self.rng)
        if now >= (self.warmup_s or 0.0):
            self.busy_s += seconds
        self._push(now + seconds, _DONE, batch)

    def _push(self, at: float, kind: int, item: _Batch | _Batcher) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, item))

    # -- results --------------------------------------------------------------------------------

    def _outcome(self, seconds: float, unfinished: int) -> Outcome:
        ordered = sorted(self.latencies)
        span = max(seconds, 1e-9)
        return Outcome(
            offered=self.offered, served=len(ordered), refused=self.refused, seconds=seconds,
            p50_s=quantile(ordered, 0.50), p90_s=quantile(ordered, 0.90),
            p99_s=quantile(ordered, 0.99), p999_s=quantile(ordered, 0.999),
            mean_s=sum(ordered) / len(ordered) if ordered else 0.0,
            utilisation=min(1.0, self.busy_s / (self.deployment.instances * span)),
            mean_batch=self.batch_sizes / self.batches if self.batches else 0.0,
            flushes=dict(self.flushes), unfinished=unfinished, finished_s=self.last_answer)


def quantile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank quantile of sorted values (0 for none)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def simulate(cost: CostModel, deployment: Deployment, arrivals: Sequence[float],
             seed: int = 0, warmup_s: float | None = None) -> Outcome:
    return Simulation(cost, deployment, seed, warmup_s).run(arrivals)
