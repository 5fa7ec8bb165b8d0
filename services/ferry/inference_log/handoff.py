"""The batcher's side of the inference log: each batch's sampled records, handed to the
model's log stream after the batch's results are written, in the background.

``LoggedStore`` wraps the batcher's task store (the composition root puts it in place when
``log_models`` names a model): its ``complete`` writes the results through the store it wraps,
then offers the new ones to the ``HandOff`` and returns; nothing of the log is awaited by the
batch. The hand-off sends one script per model in its batches (``lua/hand_off.lua``), in one
round trip, one hand-off at a time; the batches that end meanwhile wait in one pending hand-off,
bounded in bytes: past ``QUEUE_BYTES`` their records are dropped and counted (``busy``), never
held. The script drops what the stream has no room for (``full``); a Redis error drops the
hand-off's records (``error``), logged, and never reaches the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from ferry import keys, lua
from ferry.errors import RedisError
from ferry.inference_log.record import Batch, Shaping, record_of, sampled
from ferry.resp.client import Command, Commands
from ferry.tasks.base import (
    NO_LIMITS,
    NO_OWNER,
    NOT_SHARED,
    Admission,
    Admitted,
    BatcherStore,
    Completion,
    Owner,
    Sharing,
)
from ferry.tasks.record import StoredRecord, TaskRecord
from ferry.telemetry.metrics import BatcherMetrics
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)
QUEUE_BYTES = 32 << 20  # what batches waiting for the hand-off may hold (their envelopes)
RECORD_OVERHEAD = 512  # bytes a record counts beyond its envelope
CLOSE_S = 2.0  # how long ``close`` waits for the hand-off under way


class HandOffKeys(NamedTuple):
    stream: str
    recent: str
    dropped: str


class HandOffArgs(NamedTuple):
    max_records: int
    recent_max: int


class HandOffItem(NamedTuple):
    record: bytes


HAND_OFF = lua.ScriptSpec("ferry.inference_log", "hand_off", HandOffKeys._fields,
                          HandOffArgs._fields, item=HandOffItem._fields,
                          constants=(("LOG_FIELD", keys.LOG_FIELD),))


@dataclass
class Pending:
    """Batches waiting for the next hand-off: each with its sampled completions."""

    batches: list[tuple[Batch, list[Completion]]] = field(default_factory=list)
    size: int = 0  # their weight against ``QUEUE_BYTES``

    def add(self, batch: Batch, completions: list[Completion], weight: int) -> None:
        self.batches.append((batch, completions))
        self.size += weight


class HandOff:
    """Hands sampled records to the models' log streams, one hand-off at a time."""

    def __init__(self, redis: Commands, rates: Mapping[str, float], shaping: Shaping, *,
                 max_records: int, metrics: BatcherMetrics, queue_bytes: int = QUEUE_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        self.redis = redis
        self.rates = dict(rates)
        self.shaping = shaping
        self.max_records = max_records
        self.metrics = metrics
        self.queue_bytes = queue_bytes
        self.clock = clock
        self._script = redis.register_script(lua.source(HAND_OFF))
        self._pending = Pending()
        self._task: asyncio.Task[None] | None = None  # the hand-off under way

    def offer(self, completions: Sequence[Completion], written: Sequence[bool]) -> None:
        """Queue the sampled ones of a batch's completions that were written (new final
        records): no Redis call here, and none at all when none is sampled."""
        chosen = [c for c, new in zip(completions, written, strict=True)
                  if new and self._sampled(c)]
        if not chosen:
            return
        weight = sum(len(c.delivery.raw) + RECORD_OVERHEAD for c in chosen)
        if self._pending.size + weight > self.queue_bytes:
            self._dropped(chosen, "busy")
            return
        self._pending.add(Batch(secrets.token_hex(8), len(completions)), chosen, weight)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="ferry-log-handoff")
            self._task.add_done_callback(_report)

    def _sampled(self, completion: Completion) -> bool:
        task = completion.delivery.task
        if task is None or completion.record is None:
            return False
        rate = self.rates.get(task.model)
        return rate is not None and sampled(task.task_id, rate)

    async def _run(self) -> None:
        """Hand off what is pending, then what came meanwhile, until nothing is."""
        while self._pending.batches:
            pending, self._pending = self._pending, Pending()
            await self._hand_off(await self._records(pending))

    async def _records(self, pending: Pending) -> dict[str, list[bytes]]:
        """The pending batches' records, by model (the event loop's other work goes on
        between two batches' records)."""
        now, by_model = self.clock(), dict[str, list[bytes]]()
        for batch, completions in pending.batches:
            await asyncio.sleep(0)
            for completion in completions:
                task = completion.delivery.task
                assert task is not None
                try:
                    record = record_of(completion, batch, self.shaping, now)
                except Exception:  # a record that cannot be made costs itself only
                    log.exception("inference log: no record for task %s", task.task_id)
                    self._dropped([completion], "error")
                    continue
                by_model.setdefault(task.model, []).append(record)
        return by_model

    async def _hand_off(self, by_model: dict[str, list[bytes]]) -> None:
        models = list(by_model)
        commands = [self._command(model, by_model[model]) for model in models]
        try:
            replies = await self.redis.replies(commands) if commands else []
        except RedisError as exc:
            replies = [exc] * len(commands)
        for model, reply in zip(models, replies, strict=True):
            self._counted(model, len(by_model[model]), reply)

    def _command(self, model: str, records: list[bytes]) -> Command:
        return self._script.command(
            HandOffKeys(keys.log_key(model), keys.log_key(model, "recent"),
                        keys.log_key(model, "dropped")),
            [*HandOffArgs(self.max_records, keys.LOG_RECENT),
             *lua.items(HandOffItem(r) for r in records)])

    def _counted(self, model: str, records: int, reply: object) -> None:
        if isinstance(reply, BaseException):
            log.warning("inference log: %d record(s) of %s dropped: Redis: %s", records, model,
                        reply)
            self.metrics.log_dropped.labels(model, "error").inc(records)
            return
        written, lost = (int(n) for n in reply)  # type: ignore[attr-defined]
        self.metrics.log_records.labels(model).inc(written)
        if lost:
            self.metrics.log_dropped.labels(model, "full").inc(lost)

    def _dropped(self, completions: Sequence[Completion], reason: str) -> None:
        for completion in completions:
            task = completion.delivery.task
            assert task is not None
            self.metrics.log_dropped.labels(task.model, reason).inc()

    async def close(self, timeout_s: float = CLOSE_S) -> None:
        """Wait for the hand-off under way (and what is pending) for up to ``timeout_s``, then
        cancel it. Idempotent."""
        task = self._task
        if task is None or task.done():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _report(task: asyncio.Task[None]) -> None:
    """A hand-off that died of an unexpected error says so (the next batch starts another)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("inference log: a hand-off failed: %r", task.exception())


class Store(BatcherStore, Protocol):
    """The task store as a batcher uses it (``RedisTaskStore``): completion and the partition
    upkeep, and for the cascade and the rollouts' keeper, admission, reviews and reads."""

    async def read(self, task_id: str) -> StoredRecord | None: ...

    async def admit(self, task: Task, pending: TaskRecord, admission: Admission = NO_LIMITS,
                    sharing: Sharing = NOT_SHARED, owner: Owner = NO_OWNER) -> Admitted: ...

    async def write_review(self, task_id: str, marker: bytes, review: bytes,
                           url: str) -> bool: ...


class LoggedStore:
    """``inner``, whose completions are also offered to the inference log's hand-off once
    written (the batch never waits for the log)."""

    def __init__(self, inner: Store, hand_off: HandOff) -> None:
        self.inner = inner
        self.hand_off = hand_off

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """``inner.complete``; then the new records' sampled ones go to the hand-off."""
        written = await self.inner.complete(completions)
        try:
            self.hand_off.offer(completions, written)
        except Exception:  # the log never fails a batch: its results are written
            log.exception("inference log: a batch's records were not offered")
        return written

    async def cancel_requested(self, task_ids: Sequence[str]) -> list[bool]:
        return await self.inner.cancel_requested(task_ids)

    async def heal_backlog(self, partitions: Sequence[int]) -> int:
        return await self.inner.heal_backlog(partitions)

    async def read(self, task_id: str) -> StoredRecord | None:
        return await self.inner.read(task_id)

    async def admit(self, task: Task, pending: TaskRecord, admission: Admission = NO_LIMITS,
                    sharing: Sharing = NOT_SHARED, owner: Owner = NO_OWNER) -> Admitted:
        return await self.inner.admit(task, pending, admission, sharing, owner)

    async def write_review(self, task_id: str, marker: bytes, review: bytes, url: str) -> bool:
        return await self.inner.write_review(task_id, marker, review, url)
