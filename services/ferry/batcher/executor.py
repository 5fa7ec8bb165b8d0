"""Running one batch to a final answer for every request in it.

While Triton cannot be reached at all, a batch waits for it (up to ``outage_budget_s``) and the
batcher reads no new work: an outage is not the requests' fault and uses none of their attempts.
Other transient failures (overloaded, timed out) retry the whole batch with backoff. A permanent
failure of a batch of several splits it in halves until the request that causes it is alone, so
its batch-mates still succeed. A request that fails ``max_attempts`` times is FAILED with the last
error and copied to its partition's dead-letter stream. Results, dead letters and acknowledgements
are written by one script per partition: a crash before it re-runs the task, never loses it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from ferry.backoff import backoff_delay
from ferry.batcher.gate import BackendGate
from ferry.batching.policy import is_expired
from ferry.codec import outputs_to_json
from ferry.errors import (
    BackendError,
    DependencyUnavailableError,
    ModelContractError,
    PermanentBackendError,
    UnknownModelError,
)
from ferry.queue.base import Delivery
from ferry.settings import BatcherSettings
from ferry.tasks.base import Completion, TaskStore
from ferry.tasks.record import Status, TaskRecord
from ferry.telemetry.metrics import BatcherMetrics
from ferry.triton.base import InferenceBackend, ModelSpec

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
CallObserver = Callable[[str, int, float], None]  # (model, batch size, seconds) of a good call


@dataclass(frozen=True)
class Outcome:
    """The final answer for one delivery."""

    delivery: Delivery
    status: Status
    output: Any = None
    error: str | None = None
    model_version: str = ""

    def record(self, finished_at: float) -> TaskRecord | None:
        task = self.delivery.task
        if task is None:
            return None
        return TaskRecord(
            task_id=task.task_id, status=self.status, model=task.model,
            created_at=task.enqueued_at_ms / 1000.0, model_version=self.model_version,
            finished_at=finished_at, output=self.output, error=self.error)

    def completion(self, finished_at: float) -> Completion:
        """Its record, and a dead letter for a failure (or an entry that could not be read)."""
        record = self.record(finished_at)
        letter = None
        if record is None or self.status is Status.FAILED:
            letter = self.error or self.delivery.problem or "unreadable task"
        return Completion(self.delivery, record, letter)


def failed(deliveries: Sequence[Delivery], error: str) -> list[Outcome]:
    return [Outcome(d, Status.FAILED, error=error) for d in deliveries]


class BatchExecutor:
    """Infers, isolates, retries, then settles: results, dead letters, acknowledgements."""

    def __init__(
        self,
        settings: BatcherSettings,
        backend: InferenceBackend,
        store: TaskStore,
        metrics: BatcherMetrics,
        *,
        gate: BackendGate,
        observe_call: CallObserver = lambda model, size, seconds: None,
        sleep: Sleep = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.store = store
        self.metrics = metrics
        self.gate = gate
        self.observe_call = observe_call
        self.sleep = sleep
        self.jitter = jitter

    async def run(self, model: str, deliveries: Sequence[Delivery]) -> None:
        """Give every delivery a final status and settle it."""
        now_ms = int(time.time() * 1000)
        expired: list[Delivery] = []
        live: list[Delivery] = []
        for d in deliveries:
            (expired if d.task and is_expired(d.task.deadline_ms, now_ms) else live).append(d)
        self._observe_wait(model, live, now_ms)
        outcomes = [Outcome(d, Status.EXPIRED, error="deadline passed before inference")
                    for d in expired]
        if live:
            outcomes += await self._attempt(model, live, attempt=1)
        await self.settle(outcomes)

    async def _attempt(self, model: str, items: Sequence[Delivery],
                       attempt: int) -> list[Outcome]:
        try:
            spec = await self.backend.model_spec(model)
            if len(items) > spec.max_batch_size:
                return await self._split(model, items, attempt, spec.max_batch_size)
            return await self._infer(spec, items)
        except BackendError as exc:
            return await self._recover(model, items, attempt, exc)

    async def _recover(self, model: str, items: Sequence[Delivery], attempt: int,
                       exc: BackendError) -> list[Outcome]:
        """What happens to a batch after a failure, by the kind of failure."""
        if isinstance(exc, ModelContractError):
            return failed(items, str(exc))  # no retry or split can help
        kind = "transient" if exc.transient else "permanent"
        self.metrics.infer_failures.labels(model, kind).inc()
        if exc.transient and not await self.backend.server_live():
            return await self._outage(model, items, attempt, exc)
        # An unknown model may be (re)loading: retry it whole, since splitting cannot help.
        splittable = isinstance(exc, PermanentBackendError) and not isinstance(
            exc, UnknownModelError)
        if splittable and len(items) > 1:
            return await self._split(model, items, attempt, (len(items) + 1) // 2)
        return await self._retry_or_fail(model, items, attempt, exc)

    async def _outage(self, model: str, items: Sequence[Delivery], attempt: int,
                      exc: BackendError) -> list[Outcome]:
        """Triton is unreachable: wait for it (within the outage's budget), spending no attempt."""
        self.gate.close_for_outage(str(exc))
        if await self.gate.wait_open():
            return await self._attempt(model, items, attempt)
        return failed(items, f"Triton unreachable for {self.gate.budget_s:g} s: {exc}")

    async def _infer(self, spec: ModelSpec, items: Sequence[Delivery]) -> list[Outcome]:
        payloads = [d.task.payload if d.task else b"" for d in items]
        started = time.monotonic()
        inferred = await self.backend.infer(spec, payloads)
        seconds = time.monotonic() - started
        self.observe_call(spec.name, len(items), seconds)
        self.metrics.infer_seconds.labels(spec.name).observe(seconds)
        self.metrics.batch_size.labels(spec.name).observe(len(items))
        return [Outcome(d, Status.SUCCESS, output=outputs_to_json(row),
                        model_version=inferred.model_version)
                for d, row in zip(items, inferred.rows, strict=True)]

    async def _split(self, model: str, items: Sequence[Delivery], attempt: int,
                     size: int) -> list[Outcome]:
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        parts = await asyncio.gather(*(self._attempt(model, c, attempt) for c in chunks))
        return [outcome for part in parts for outcome in part]

    async def _retry_or_fail(self, model: str, items: Sequence[Delivery], attempt: int,
                             exc: BackendError) -> list[Outcome]:
        if attempt >= self.settings.max_attempts:
            log.warning("giving up on %d task(s) of %s after %d attempts: %s",
                        len(items), model, attempt, exc)
            return failed(items, f"failed after {attempt} attempt(s): {exc}")
        await self.sleep(backoff_delay(attempt, self.settings.backoff_base_ms / 1000.0,
                                       self.settings.backoff_max_ms / 1000.0, self.jitter()))
        return await self._attempt(model, items, attempt + 1)

    async def settle(self, outcomes: Sequence[Outcome]) -> bool:
        """Write results and dead letters and acknowledge, in one round trip; False if Redis
        would not. Unsettled entries stay pending in their stream, and a batcher reclaims them.

        A duplicate delivery whose task already has a final answer writes nothing and leaves no
        dead letter: the first answer stands.
        """
        finished_at = time.time()
        completions = [o.completion(finished_at) for o in outcomes]
        for attempt in range(1, self.settings.max_attempts + 1):
            try:
                written = await self.store.complete(completions)
            except (DependencyUnavailableError, RedisError, OSError) as exc:
                log.warning("could not settle %d task(s) (try %d): %s", len(outcomes), attempt, exc)
                await self.sleep(backoff_delay(attempt, 0.1, 2.0, self.jitter()))
                continue
            self._count([o for o, new in zip(outcomes, written, strict=True) if new])
            return True
        return False

    def _count(self, settled: Sequence[Outcome]) -> None:
        for outcome in settled:
            model = outcome.delivery.task.model if outcome.delivery.task else ""
            self.metrics.finished.labels(model, outcome.status.value).inc()
            if outcome.status is Status.FAILED:
                self.metrics.dead_lettered.inc()

    def _observe_wait(self, model: str, items: Sequence[Delivery], now_ms: int) -> None:
        for delivery in items:
            if delivery.task is not None:
                waited = max(0, now_ms - delivery.task.enqueued_at_ms) / 1000.0
                self.metrics.queue_wait.labels(model).observe(waited)
