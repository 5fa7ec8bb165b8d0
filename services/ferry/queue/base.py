"""What the batcher and gateway need from a partitioned, at-least-once task queue."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferry.results.base import ResultRecord
from ferry.v1.task_pb2 import Task


@dataclass(frozen=True)
class Delivery:
    """One queue entry handed to a batcher; it stays pending until acknowledged."""

    stream: str
    entry_id: str
    raw: bytes
    task: Task | None  # None when the entry did not decode
    problem: str = ""  # why it did not decode
    deliveries: int = 1  # how often the queue has handed it out (reclaims included)


DeadLetter = dict[str, bytes | str]


def dead_letter_fields(delivery: Delivery, error: str, failed_at: float) -> DeadLetter:
    """A dead-letter record: the envelope as it was queued, where it came from, why it failed."""
    task = delivery.task
    return {
        "task": delivery.raw, "error": error, "stream": delivery.stream,
        "entry_id": delivery.entry_id, "failed_at": repr(failed_at),
        "task_id": task.task_id if task else "", "model": task.model if task else "",
        "deliveries": str(delivery.deliveries),
    }


class TaskQueue(Protocol):
    async def ensure_groups(self) -> None: ...

    async def enqueue(self, task: Task, pending: ResultRecord) -> None: ...

    async def read(self, count: int, block_ms: int) -> list[Delivery]: ...

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Delivery]: ...

    async def touch(self, deliveries: Iterable[tuple[str, str]]) -> None: ...

    async def release(self, deliveries: Sequence[Delivery]) -> None: ...

    async def forget_consumer(self) -> bool: ...

    async def ack(self, deliveries: Sequence[Delivery]) -> None: ...

    async def dead_letter(self, deliveries: Sequence[tuple[Delivery, str]]) -> None: ...

    async def depth(self) -> int: ...
