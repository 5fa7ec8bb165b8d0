"""The batcher's part in model versions: every task it ends that was sent to a version (pinned
by its request, or given one by its model's rollout; a task left to Triton's policy is not) is
tallied by (model, version) and added into Redis every ``FLUSH_S`` (the rollouts' figures,
merged over every batcher); the
cascade's reviews (``reviews``); and, on the batcher that owns partition 0, the rollouts'
keeper (the guard's decisions and the shadow comparison), every ``rollout_check_s``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from ferry.batcher.executor import Outcome
from ferry.batcher.keeper import RolloutKeeper
from ferry.batcher.reviews import Reviews, ReviewStore, with_review
from ferry.errors import RedisError, RedisUnavailableError
from ferry.resp.client import Commands
from ferry.rollouts.guard import Decision
from ferry.rollouts.rollout import Rollout
from ferry.rollouts.store import RolloutStore, apply_declared
from ferry.rollouts.window import Tally
from ferry.settings import BatcherSettings
from ferry.tasks.capacity import CapacityBoard
from ferry.tasks.record import Status, StoredRecord
from ferry.telemetry.metrics import BatcherMetrics
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)
FLUSH_S = 1.0


class Records(ReviewStore, Protocol):
    """The task records the desk reads (shadow pairs) and writes (reviews)."""

    async def read(self, task_id: str) -> StoredRecord | None: ...


class VersionDesk:
    """Start, stop; ``prepare`` and ``settled`` are called for every batch the batcher ends."""

    def __init__(self, settings: BatcherSettings, hot: Commands, records: Records,
                 owned: Sequence[int], metrics: BatcherMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.tally = Tally()
        self.store = RolloutStore(hot)
        self.declared = settings.declared_rollouts
        cascades = settings.declared_cascades
        self.reviews = (Reviews(cascades, records, max_backlog=settings.review_max_backlog,
                                partitions=settings.partitions) if cascades else None)
        self.capacity = CapacityBoard(hot)
        self.keeper = (RolloutKeeper(self.store, records.read, self._decided, self._breaker)
                       if 0 in owned else None)
        self._loops: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if self.declared:
            with contextlib.suppress(RedisUnavailableError):  # the gateways write it too
                await apply_declared(self.store, self.declared)
        self._loops = [asyncio.create_task(self._every(FLUSH_S, self.flush), name="ferry-tally")]
        if self.keeper is not None:
            self._loops.append(asyncio.create_task(
                self._every(self.settings.rollout_check_s, self._keep), name="ferry-rollouts"))

    async def stop(self) -> None:
        for loop in self._loops:
            loop.cancel()
        if self._loops:
            await asyncio.wait(self._loops, timeout=2.0)
        self._loops = []
        with contextlib.suppress(RedisError):
            await self.flush()
        if self.reviews is not None:
            await self.reviews.stop()

    async def prepare(self, outcomes: Sequence[Outcome]) -> Sequence[Outcome]:
        """The outcomes with the review entries their cascade wants (reviews admitted)."""
        reviews = self.reviews
        if reviews is None:
            return outcomes
        wanted = [reviews.wanted(o.delivery.task, o.status, o.output) for o in outcomes]
        if not any(wanted):
            return outcomes
        prepared = list(outcomes)
        for index, cascade in enumerate(wanted):
            task = outcomes[index].delivery.task
            if cascade is not None and task is not None:
                prepared[index] = with_review(outcomes[index], await reviews.begin(task, cascade))
        return prepared

    def settled(self, outcomes: Sequence[Outcome], finished_at: float) -> None:
        """Tally each outcome, and each Triton call once; write each review's end into the
        record it reviewed."""
        calls: set[tuple[str, str, int, float]] = set()
        for outcome in outcomes:
            task = outcome.delivery.task
            if task is None:
                continue
            if task.model_version:  # a rollout's tasks always are: it gives them a version
                version = outcome.model_version or task.model_version
                self._tally(task, version, outcome, finished_at)
                if outcome.infer_s > 0 and not task.shadow_of:  # a call's tasks share both
                    calls.add((task.model, version, outcome.rows, outcome.infer_s))
            if task.review_of and self.reviews is not None:
                self.reviews.finish(task, outcome)
        for model, version, rows, seconds in calls:
            self.tally.call(model, version, finished_at, rows=rows, seconds=seconds)

    def _tally(self, task: Task, version: str, outcome: Outcome, finished_at: float) -> None:
        total_s = max(0.0, finished_at - task.enqueued_at_ms / 1000.0)
        self.tally.add(task.model, version, finished_at, error=outcome.status is Status.FAILED,
                       queue_s=max(0.0, total_s - outcome.infer_s), triton_s=outcome.infer_s,
                       shadow=bool(task.shadow_of))

    async def _breaker(self, model: str, version: str) -> str:
        state, _ = (await self.capacity.of(model)).breaker_of(version)
        return state

    async def flush(self) -> None:
        """Add what was tallied into Redis (kept for the next flush if Redis refuses)."""
        if not len(self.tally):
            return
        drained = self.tally.drain()
        try:
            await self.store.add_tally(drained)
        except RedisUnavailableError:
            self.tally.merge(drained)
            raise

    async def _keep(self) -> None:
        assert self.keeper is not None
        for model, rollout in (await self.keeper.round()).items():
            self.metrics.rollout_share.labels(model, rollout.candidate).set(
                rollout.share if rollout.live else 0.0)

    def _decided(self, rollout: Rollout, decision: Decision) -> None:
        self.metrics.rollout_decisions.labels(rollout.model, decision.action).inc()

    async def _every(self, period_s: float, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` every ``period_s`` until cancelled; a failure is logged, not fatal."""
        while True:
            await asyncio.sleep(period_s)
            started = time.monotonic()
            try:
                await step()
            except RedisUnavailableError as exc:
                log.warning("%s: Redis refused (%s); trying again", step.__name__, exc)
            except Exception:  # a bad rollout or record must not stop the batcher
                log.exception("%s failed; trying again", step.__name__)
            if time.monotonic() - started > period_s:
                log.info("%s took %.1f s", step.__name__, time.monotonic() - started)
