"""Reporting: each model's measured capacity for the gateways' admission, and the depth of the
owned partitions for the dashboards."""

from __future__ import annotations

import logging
import time

from ferry.batcher.models import ModelBook
from ferry.batcher.shared import Rounds, Shared
from ferry.errors import RedisUnavailableError
from ferry.queue.base import TaskQueue
from ferry.resp.client import Commands
from ferry.rules.breaker import BreakerState
from ferry.rules.estimators import service_rate
from ferry.rules.policy import BatchPolicy
from ferry.settings import BatcherSettings
from ferry.tasks import capacity
from ferry.tasks.capacity import Capacity
from ferry.telemetry.metrics import BatcherMetrics

log = logging.getLogger(__name__)


class Reporter:
    """Publishes capacities every second and the queue's depth every claim interval."""

    def __init__(self, settings: BatcherSettings, hot: Commands, queue: TaskQueue,
                 metrics: BatcherMetrics, *, consumer: str, models: ModelBook,
                 policy: BatchPolicy, shared: Shared) -> None:
        """Of what the loops share it reads the clock and whether the batcher stops."""
        self.settings = settings
        self.hot = hot
        self.queue = queue
        self.metrics = metrics
        self.consumer = consumer
        self.models = models
        self.policy = policy
        self.signals = shared.signals
        self.clock = shared.clock
        self.depth_rounds = Rounds()  # of depth_loop
        self.fallbacks = settings.fallbacks

    async def report_loop(self) -> None:
        """Publish each model's measured capacity every second, for the gateways' admission."""
        while not await self.signals.until_stopped(capacity.REPORT_INTERVAL_S):
            try:
                await capacity.report(self.hot, self.consumer, self.capacities(), time.time())
            except RedisUnavailableError as exc:
                log.warning("reporting capacity failed: %s", exc)

    def capacities(self) -> dict[str, Capacity]:
        """What each model this batcher has called can serve (full batches on every slot), and
        the state of each version's circuit breaker."""
        now = self.clock()
        measured: dict[str, Capacity] = {}
        for name, state in self.models:
            batch = self.policy.limit(state.capacity)
            rate = service_rate(state.cost, state.slots, batch)
            breakers = {version: (b.state(now), b.retry_after(now))
                        for version, b in state.breakers.items()}
            for version, (breaker, _) in breakers.items():
                self.metrics.circuit.labels(name, version).set(breaker.gauge)
            policy, retry_after = breakers.pop("", (BreakerState.CLOSED, 0.0))
            if rate > 0 or breakers or policy is not BreakerState.CLOSED:
                measured[name] = Capacity(
                    rate, state.cost.mean_s, policy.value, self.fallbacks.of(name) or "",
                    retry_after, tuple((v, b.value, r) for v, (b, r) in sorted(breakers.items())))
        return measured

    async def depth_loop(self) -> None:
        """Measure the queue's depth, and each owned partition's, every claim interval."""
        interval = self.settings.claim_interval_ms / 1000.0
        while not await self.signals.until_stopped(interval):
            with self.depth_rounds.round():
                try:
                    await self.measure_depth()
                except RedisUnavailableError as exc:
                    log.warning("measuring the queue's depth failed: %s", exc)

    async def measure_depth(self) -> None:
        self.metrics.queue_depth.set(await self.queue.depth())
        for partition, (depth, held) in (await self.queue.partition_stats()).items():
            self.metrics.partition_depth.labels(str(partition)).set(depth)
            self.metrics.partition_pending.labels(str(partition)).set(held)

    async def withdraw(self) -> None:
        """Take this batcher's capacities back: it serves no model any more."""
        await capacity.withdraw(self.hot, self.consumer, self.models.names())
