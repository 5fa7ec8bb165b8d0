"""What the gateway and the batcher need from the owner of task records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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


class TaskStore(Protocol):
    """Admission, completion and reads of task records, each atomic with its queue entry."""

    async def admit(self, task: Task, pending: TaskRecord) -> StoredRecord:
        """Record the task as PENDING and append it to its partition, in one step."""
        ...

    async def read(self, task_id: str) -> StoredRecord | None:
        """The record, or None for an unknown or expired task."""
        ...

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """Write final records, dead letters and acknowledgements; for each, whether it was new.

        False: a final record was there already (a duplicate delivery ran the task again), and
        nothing was written for it: the first answer stands.
        """
        ...
