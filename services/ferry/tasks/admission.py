"""The one way in: a task's envelope admitted under its limits, stored, and counted.

Every admission goes through an ``Admit`` port: ``/v1`` and the protocol's routes (the
gateway's ``Admitter`` with the limits the batchers' measurements size), bulk jobs (the same,
through ``jobs.port``), a rollout's shadow copies (``gateway.shadows``, a layer around it), and
the cascade's reviews (the batcher's, with fixed limits). Idempotency (``tasks.repeats``) is
a layer above it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ferry.errors import ServiceUnavailableError
from ferry.priority import Priority
from ferry.tasks.base import NO_OWNER, Admission, Admitted, Owner, Sharing
from ferry.tasks.capacity import Capacity, CapacityBoard
from ferry.tasks.envelope import Envelope, timeout_of
from ferry.tasks.record import StoredRecord, TaskRecord
from ferry.v1.task_pb2 import Task

UNMEASURED_BACKLOG_LIMIT = 1000  # per model, until a batcher has measured its throughput
ADMISSIONS_KEPT = 1024  # kinds of task (model, version, priority, timeout) whose limits are kept


@dataclass(frozen=True)
class Submitted:
    """An admitted (or replayed) task: its id, its final record when the client waited for it
    and it has one, and whether it is a repeat's answer."""

    task_id: str
    record: StoredRecord | None = None
    replayed: bool = False


class Admit(Protocol):
    """The port: admit a task's envelope for its owner."""

    async def __call__(self, envelope: Envelope, owner: Owner = NO_OWNER) -> Admitted: ...


class Limits(Protocol):
    """The limits a new task of a kind is admitted under."""

    async def admission(self, model: str, version: str, priority: Priority,
                        timeout_s: float) -> Admission: ...


class Storing(Protocol):
    """The task store's side of an admission (``TaskStore.admit``)."""

    async def admit(self, task: Task, pending: TaskRecord, admission: Admission = ...,
                    sharing: Sharing = ..., owner: Owner = ...) -> Admitted: ...


Counted = Callable[[Task, Admitted, float], None]  # a task admitted, and when it was accepted


def _uncounted(task: Task, admitted: Admitted, accepted_at: float) -> None:
    """Nothing counts."""


class Admitter:
    """Admits envelopes: the limits of their kind, the store's one step, the count."""

    def __init__(self, store: Storing, limits: Limits, counted: Counted = _uncounted) -> None:
        self.store = store
        self.limits = limits
        self.counted = counted

    async def __call__(self, envelope: Envelope, owner: Owner = NO_OWNER) -> Admitted:
        task = envelope.task
        admission = await self.limits.admission(task.model, task.model_version,
                                                Priority.of(task.priority), timeout_of(task))
        admitted = await self.store.admit(task, envelope.pending, admission, envelope.sharing,
                                          owner)
        self.counted(task, admitted, envelope.pending.created_at)
        return admitted


@dataclass(frozen=True)
class FixedLimits:
    """The same limits for every task (the cascade's reviews: a backlog bound of their own)."""

    fixed: Admission

    async def admission(self, model: str, version: str, priority: Priority,
                        timeout_s: float) -> Admission:
        return self.fixed


class MeasuredLimits:
    """The gateway's limits: a priority's share of the model's backlog limit (set, or sized
    from the rate the batchers measure to ``max_queue_wait_s`` of work), the rate to predict a
    task's wait, and a 503 while the version's circuit breaker is open in every batcher and no
    fallback answers. The limits of a kind are kept until the capacity view changes."""

    def __init__(self, capacity: CapacityBoard, *, max_backlog: int, max_queue_wait_s: float,
                 partitions: int) -> None:
        self.capacity = capacity
        self.max_backlog = max_backlog
        self.max_queue_wait_s = max_queue_wait_s
        self.partitions = partitions
        self._kept: dict[tuple[str, str, Priority, float], tuple[Capacity, Admission]] = {}

    async def admission(self, model: str, version: str, priority: Priority,
                        timeout_s: float) -> Admission:
        capacity = await self.capacity.of(model)
        key = (model, version, priority, timeout_s)
        kept = self._kept.get(key)
        if kept is not None and kept[0] is capacity:
            return kept[1]
        _refuse_open(model, version, capacity)
        limit = self.max_backlog
        if not limit:
            limit = (math.ceil(capacity.rate * self.max_queue_wait_s) if capacity.rate
                     else UNMEASURED_BACKLOG_LIMIT)
        admission = Admission(limit=max(1, math.floor(limit * priority.backlog_share)),
                              rate=capacity.rate, batch_s=capacity.batch_s, timeout_s=timeout_s,
                              partitions=self.partitions)
        if len(self._kept) > ADMISSIONS_KEPT:
            self._kept.clear()
        self._kept[key] = (capacity, admission)
        return admission


def _refuse_open(model: str, version: str, capacity: Capacity) -> None:
    breaker, retry_after_s = capacity.breaker_of(version)
    if breaker == "open" and not capacity.fallback:
        named = f"model {model!r}" + (f" version {version}" if version else "")
        raise ServiceUnavailableError(
            "circuit_open", f"{named} is failing (its circuit breaker is open) and has no "
            "fallback model; try again later", retry_after_s)
