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
    """The partitioned queue as one batcher's consumer sees it (``RedisStreamQueue``)."""

    async def ensure_groups(self) -> None:
        """Create the consumer group on every owned stream, if missing."""
        ...

    async def read(self, count: int, block_ms: int,
                   priorities: Sequence[Priority] = BY_URGENCY) -> list[Delivery]:
        """Up to ``count`` new entries per owned stream of ``priorities``, blocking up to
        ``block_ms`` for any (0: only what is there now); most urgent first."""
        ...

    def awake(self, holding: Iterable[Priority] = (), *, poll: bool = False) -> list[Priority]:
        """The priorities worth a read now, most urgent first (``holding``: held here)."""
        ...

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Delivery]:
        """Take over up to ``count`` entries per stream idle for ``min_idle_ms``."""
        ...

    async def recheck_fair(self) -> None:
        """Look again for fair queues that hold tasks (their doorbell may have been missed)."""
        ...

    async def beat(self, lease_ms: int) -> list[str]:
        """Renew this consumer's lease (it is dead once not renewed for ``lease_ms``); the
        consumers whose lease has run out."""
        ...

    async def rescue(self, dead: str, room: int) -> tuple[list[Delivery], bool]:
        """Take over up to ``room`` entries a dead consumer held (each taken by one consumer
        only); and whether it still holds any."""
        ...

    def live_batchers(self) -> int:
        """How many consumers held a live lease at this one's last ``beat`` (itself included)."""
        ...

    async def bury(self, dead: str) -> None:
        """Forget the lease of a dead consumer that holds nothing any more."""
        ...

    async def touch(self, deliveries: Iterable[tuple[str, str]]) -> None:
        """Reset the idle time of held entries, (stream, entry id), so none reclaims them."""
        ...

    async def take_riders(self, riders: Sequence[tuple[str, str, str]]) -> list[Delivery]:
        """Move entries other batchers offered to a shared budget (owner, stream, entry id)
        to this consumer, with their tasks; only those their owner still holds."""
        ...

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Hand unfinished entries back as new ones (delivery count 1), for any consumer to
        read at once, without waiting ``claim_idle_ms`` or counting a failed delivery."""
        ...

    async def forget_consumer(self) -> bool:
        """Remove this consumer from the group if it holds nothing; whether it did."""
        ...

    async def depth(self) -> int:
        """Entries not yet finished, over all partitions and priorities (new and pending)."""
        ...

    async def partition_stats(self) -> dict[int, tuple[int, int]]:
        """Per owned partition: (its unfinished entries, how many of them a batcher holds)."""
        ...

    async def close(self) -> None:
        """Close the queue's own connections (a blocked read ends)."""
        ...
