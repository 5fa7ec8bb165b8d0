"""What the gateway and the batcher need from the owner of task records."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from ferry import keys
from ferry.errors import TooManyRequestsError
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.tasks.record import StoredRecord, TaskRecord
from ferry.v1.task_pb2 import Task


@dataclass(frozen=True)
class Completion:
    """How one delivery ends: its final record (None: an unreadable entry, which has no task id),
    and, for a failure that is final, the reason it is dead-lettered."""

    delivery: Delivery
    record: TaskRecord | None
    dead_letter: str | None = None
    reusable: bool = False  # a success of the model and version its digest names: cacheable
    rows: int = 0  # what it cost, for the usage ledger: its rows in the call that answered it
    gpu_us: int = 0  # and its share of that call's time, microseconds (0: no call answered it)


RATE_HEADROOM = 0.85  # predictions count on this share of the measured rate


@dataclass(frozen=True)
class Admission:
    """The limits a new task is admitted under, for its model and priority.

    The backlog is counted per partition (atomically, by the script that admits), so the
    model's limit is split over the partitions, the remainder to the first ones: the total
    stays within ``limit`` under any burst, from any number of gateways (and, since tasks spread
    evenly, comes close to it).
    """

    limit: int = 0  # the model's backlog limit for this priority, all partitions (0: none)
    rate: float = 0.0  # the model's measured service rate, tasks/s (0: not measured yet)
    batch_s: float = 0.0  # one batch's time at Triton
    timeout_s: float = 0.0  # the client's deadline, seconds from now (0: none)
    partitions: int = 1

    @functools.cached_property
    def script_args(self) -> tuple[tuple[int, ...], bytes, bytes, bytes]:
        """What the admission script takes, formatted once: each partition's limit, the rate per
        partition, the fixed wait and the timeout."""
        return (tuple(self.partition_limit(p) for p in range(self.partitions)),
                b"%r" % self.partition_rate, b"%r" % self.fixed_wait_s, b"%r" % self.timeout_s)

    def partition_limit(self, partition: int) -> int:
        """This partition's share of ``limit`` (0: no limit; at least 1)."""
        return partition_share(self.limit, self.partitions, partition)

    @property
    def partition_rate(self) -> float:
        """What one partition's tasks can count on: its share of the rate, less headroom for
        the time between batches that the fit of t(B) does not see."""
        return RATE_HEADROOM * self.rate / self.partitions

    @property
    def fixed_wait_s(self) -> float:
        """What a task waits besides the backlog ahead: the batch at Triton, and its own."""
        return 2 * self.batch_s

    def backlog_full(self, model: str, priority: Priority, partition_backlog: int
                     ) -> TooManyRequestsError:
        backlog = partition_backlog * self.partitions
        drain_s = (backlog - self.limit) / self.rate if self.rate > 0 else 1.0
        return TooManyRequestsError(
            "backlog_full", f"model {model!r} has about {backlog} unfinished tasks, the limit "
            f"for {priority.label} priority is {self.limit}: try again later",
            retry_after_s=min(60.0, max(1.0, drain_s)))

    def too_slow(self, model: str, priority: Priority, predicted_s: float
                 ) -> TooManyRequestsError:
        return TooManyRequestsError(
            "deadline_unmeetable", f"the predicted wait for a {priority.label}-priority task of "
            f"model {model!r} is {predicted_s:.2f} s, longer than its timeout of "
            f"{self.timeout_s:g} s", retry_after_s=max(1.0, predicted_s - self.timeout_s))


NO_LIMITS = Admission()


def input_digest(model: str, version: str, payload: bytes) -> str:
    """SHA-256 (hex) of what decides a model's answer: the model, its version and the input."""
    return hashlib.sha256(f"{len(model)}:{model}\0{version}\0".encode() + payload).hexdigest()


@dataclass(frozen=True)
class Sharing:
    """How a task may share work with identical requests: ``digest`` names (model, version,
    payload); ``lookup`` a cached answer; ``collapse`` onto an identical task in flight."""

    digest: str = ""
    lookup: bool = False
    collapse: bool = False


NOT_SHARED = Sharing()


def partition_share(total: int, partitions: int, partition: int) -> int:
    """A partition's share of a limit counted per partition: the remainder to the first ones,
    at least 1 (0: no limit)."""
    if total <= 0:
        return 0
    share, remainder = divmod(total, partitions)
    return max(1, share + (partition < remainder))


@dataclass(frozen=True)
class Owner:
    """The authenticated client a task belongs to (only it may read or cancel the task), and
    how many unfinished tasks it may hold (0: no limit), counted per partition as the backlog
    is. ``NO_OWNER``: authentication is off."""

    client_id: str = ""
    max_pending: int = 0
    weight: float | None = None  # its fair-share weight from its credential (None: settings')

    @property
    def field(self) -> str:
        """Its count's field in a partition's backlog hash ('' when not counted)."""
        return keys.client_backlog_field(self.client_id) if self.max_pending else ""

    def pending_limit(self, partition: int, partitions: int) -> int:
        return partition_share(self.max_pending, partitions, partition)

    def too_many(self, partition_held: int, partitions: int) -> TooManyRequestsError:
        return TooManyRequestsError(
            "too_many_pending", f"client {self.client_id!r} holds about "
            f"{partition_held * partitions} unfinished tasks, its limit is {self.max_pending}: "
            "wait for some to finish", retry_after_s=1.0)


NO_OWNER = Owner()


@dataclass(frozen=True)
class Admitted:
    """The record a new task starts with, and how it was admitted: ``queued`` for inference,
    ``hit`` (answered from the result cache: the record is final) or ``collapsed`` onto an
    identical task in flight."""

    record: StoredRecord
    how: str = "queued"


class CancelOutcome(IntEnum):
    """What a cancel request found (the values are the cancel script's)."""

    UNKNOWN = 0  # no such task (or another client's)
    FINAL = 1  # already final: the record
    CANCELLED = 2  # cancelled at once, never read by a batcher: the record
    SIGNALLED = 3  # held by a batcher, which was asked to cancel it (unless sent to Triton)
    SHARED = 4  # identical requests follow its inference: it runs for them


@dataclass(frozen=True)
class Cancellation:
    """What a cancel request found, and the record when it has one (FINAL, CANCELLED)."""

    outcome: CancelOutcome
    record: StoredRecord | None


class GatewayStore(Protocol):
    """What the gateway needs of the owner of task records: admission, reads and cancels, each
    atomic with the task's queue entry."""

    async def admit(self, task: Task, pending: TaskRecord, admission: Admission = NO_LIMITS,
                    sharing: Sharing = NOT_SHARED, owner: Owner = NO_OWNER) -> Admitted:
        """Record the task as PENDING and append it to its partition, in one step, unless its
        model's backlog, its deadline or its owner's limit refuses it
        (``TooManyRequestsError``)."""
        ...

    async def read(self, task_id: str) -> StoredRecord | None:
        """The record, or None for an unknown or expired task."""
        ...

    async def reconfirm(self, task_id: str) -> None:
        """With replicas to confirm admissions: wait until they have what the task's partition
        holds now, else refuse (503). Without: nothing."""
        ...

    async def read_owned(self, task_id: str, client_id: str) -> StoredRecord | None:
        """The record if it belongs to ``client_id``, else None (as for an unknown task)."""
        ...

    async def cancel(self, task_id: str, client_id: str = "") -> Cancellation:
        """End the task CANCELLED if it has not reached Triton (see ``CancelOutcome``); with
        ``client_id``, only a task of that client."""
        ...

    async def expire(self, task_id: str) -> StoredRecord | None:
        """End the task EXPIRED, its deadline passed, unless it has a final record: the final
        record either way; None if unknown, or identical requests follow it."""
        ...

    async def backlog(self, model: str) -> dict[Priority, int]:
        """The model's unfinished tasks by priority, over all partitions."""
        ...


class BatcherStore(Protocol):
    """What a batcher needs of the owner of task records: completion, atomic with the
    acknowledgement of the entries, and the partition upkeep it does while reclaiming."""

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """Write final records, dead letters and acknowledgements; for each, whether it was new.

        False: a final record was there already (a duplicate delivery ran the task again), and
        nothing was written for it: the first answer stands.
        """
        ...

    async def cancel_requested(self, task_ids: Sequence[str]) -> list[bool]:
        """Whether each task was flagged for cancellation (for tasks a batcher reclaims)."""
        ...

    async def heal_backlog(self, partitions: Sequence[int]) -> int:
        """Reset the backlog counts of partitions that have no unfinished task; how many were."""
        ...


class TaskStore(GatewayStore, BatcherStore, Protocol):
    """The whole owner of task records (``RedisTaskStore``)."""
