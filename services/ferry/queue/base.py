"""What a batcher needs from a partitioned, at-least-once task queue.

Admission, completion and acknowledgement belong to the task store (``ferry.tasks``), which does
each atomically with the task's record; the queue hands entries out and takes them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferry.priority import BY_URGENCY, Priority
from ferry.v1.task_pb2 import Task


@dataclass(frozen=True)
class Delivery:
    """One queue entry handed to a batcher; it stays pending until acknowledged."""

    partition: int
    stream: str
    entry_id: str
    raw: bytes
    task: Task | None  # None when the entry did not decode
    problem: str = ""  # why it did not decode
    deliveries: int = 1  # how often the queue has handed it out (reclaims included)

    @property
    def key(self) -> tuple[str, str]:
        """Identifies the entry: (stream, entry id)."""
        return self.stream, self.entry_id


class TaskQueue(Protocol):
    async def ensure_groups(self) -> None: ...

    async def read(self, count: int, block_ms: int,
                   priorities: Sequence[Priority] = BY_URGENCY) -> list[Delivery]: ...

    def awake(self, holding: Iterable[Priority] = ()) -> list[Priority]: ...

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Delivery]: ...

    async def touch(self, deliveries: Iterable[tuple[str, str]]) -> None: ...

    async def release(self, deliveries: Sequence[Delivery]) -> None: ...

    async def forget_consumer(self) -> bool: ...

    async def depth(self) -> int: ...

    async def close(self) -> None: ...
