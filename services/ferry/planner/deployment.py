"""What the planner's simulation sizes and answers (``ferry.planner.simulate``): the deployment
being sized, the bound a run must hold, and what a run measured."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ferry.errors import ConfigError
from ferry.planner.cpu import CpuCost


@dataclass(frozen=True)
class Deployment:
    """What is being sized: Triton's model instances (on its replicas), batchers, and the batching
    settings."""

    instances: int  # model instances over all Triton replicas: the in-flight budget
    max_batch: int = 64
    max_wait_s: float = 0.05
    batchers: int = 1
    inflight: int = 0  # at most this many batches per batcher at Triton at once; 0: the budget
    adaptive: bool = True
    overhead_s: float = 0.0
    max_backlog: int = 0  # 0: no admission limit
    slo_s: float = 0.0  # the batcher's SLO (FERRY_SLO_MS): 0, none
    cpu: CpuCost | None = None  # Ferry's processes as servers (None: only overhead_s)
    gateways: int = 1  # with cpu: gateway worker processes (a gateway runs one per core)
    redis_shards: int = 1  # with cpu: Redis servers the partitions are spread over
    slowdown: float = 1.0  # with cpu: how much longer each piece of work takes than its CPU
    # time (cores shared with other busy processes; 1: a core each)
    replicas: int = 1  # Triton replicas the instances are spread over, as many on each
    shared_budget: bool = True  # the batchers share the instances as their in-flight budget;
    # False: each batcher has its own window of them (FERRY_INFLIGHT_BUDGET=local)
    riders: bool = True  # with the budget shared: the fleet's one queue, riders and a slot
    # that stays with its batcher (FERRY_BUDGET_RIDERS); False: first come, first served
    batches_per_instance: int = 1  # FERRY_BATCHES_PER_INSTANCE: one runs, the rest wait there

    def __post_init__(self) -> None:
        if min(self.instances, self.batchers, self.max_batch, self.gateways,
               self.redis_shards, self.replicas, self.batches_per_instance) < 1:
            raise ConfigError("instances, replicas, batchers, gateways, Redis shards, "
                              "max_batch and batches per instance must be at least 1")
        if self.instances % self.replicas:
            raise ConfigError(f"{self.instances} instances do not spread evenly over "
                              f"{self.replicas} replicas")
        if self.slowdown < 1:
            raise ConfigError("slowdown must be at least 1")
        if self.max_wait_s < 0 or self.overhead_s < 0 or self.slo_s < 0:
            raise ConfigError("max_wait, overhead and slo must be >= 0")

    @property
    def window(self) -> int:
        """The most batches one batcher may have at Triton at once (with a shared budget, the
        budget holds them back too)."""
        return self.inflight or self.instances * self.batches_per_instance

    @property
    def slots(self) -> int:
        """The most batches at Triton at once: the shared budget, or without one every
        batcher's window."""
        if self.shared_budget:
            return self.instances * self.batches_per_instance
        return self.batchers * self.window

    @property
    def shares_budget(self) -> bool:
        """Whether batchers share the budget (through Redis, in Ferry): more than one, and
        the budget shared."""
        return self.shared_budget and self.batchers > 1

    @property
    def fleet(self) -> int:
        """The batchers whose work a slot's batch may carry (``ferry.planner.fleet``): all of
        them where they share the budget with riders, else its own batcher's."""
        return self.batchers if self.riders and self.shares_budget else 1

    @property
    def instances_per_replica(self) -> int:
        return self.instances // self.replicas


@dataclass(frozen=True)
class Bound:
    """What a run must hold to be of use (a sizing's target): its p99, and the share of the
    arrivals admission may refuse. A run stops as soon as it can no longer hold it."""

    p99_s: float = math.inf
    refused: float = 1.0


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
    cpu_busy: dict[str, float] = field(default_factory=dict)  # busiest server of each process
    peak_in_flight: int = 0  # the most batches at Triton at once (the budget bounds it)
    handovers: int = 0  # slots batchers gave back to the shared budget (Redis calls, in Ferry;
    # none where one batcher, or none shares it); a slot kept for its next batch is none
    riders: int = 0  # tasks that rode another batcher's batch (the fleet's one queue)
    stopped: bool = False  # stopped early, its bound broken: the figures cover only part of it
    slo_changes: bool | None = None  # with a shadow SLO: whether it would have changed one of
    # the batchers' decisions (None: no shadow asked)

    @property
    def throughput(self) -> float:
        return self.served / self.seconds if self.seconds > 0 else 0.0
