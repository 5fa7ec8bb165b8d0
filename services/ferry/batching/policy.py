"""The batching policy: a ferry leaves when it is full or when its departure time comes.

Pure functions over plain values and a ``now`` the caller supplies, so that the same code drives the
batcher (with ``time.monotonic``) and can be tested or simulated with any clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """What one model's queue looks like to the policy."""

    model: str
    count: int  # requests waiting
    oldest: float  # arrival time of the first of them, on the caller's clock
    capacity: int  # the largest batch the model accepts (Triton's max_batch_size)


@dataclass(frozen=True)
class Plan:
    """What to do now, and when to look again."""

    flush: tuple[tuple[str, int], ...]  # (model, batch size) to send now, most urgent first
    wake_in: float | None  # seconds until the next departure falls due; None: nothing waits


@dataclass(frozen=True)
class BatchPolicy:
    """Flush ``max_batch`` requests at once, or whatever waits ``max_wait_s`` after the first."""

    max_batch: int
    max_wait_s: float

    def limit(self, capacity: int) -> int:
        """The batch size for a model that takes at most ``capacity`` per call."""
        return max(1, min(self.max_batch, capacity))

    def due_at(self, queue: Waiting) -> float:
        """When the queue's departure falls due, on the caller's clock."""
        return queue.oldest + self.max_wait_s

    def ready(self, queue: Waiting, now: float) -> bool:
        """Full, or its first request has waited long enough."""
        if queue.count <= 0:
            return False
        return queue.count >= self.limit(queue.capacity) or now >= self.due_at(queue)

    def plan(self, queues: Iterable[Waiting], now: float, free_slots: int) -> Plan:
        """Batches to send now (at most ``free_slots``) and the wait until the next is due.

        A queue holding several full batches yields them all. Due queues are served oldest first.
        When a due batch finds no free slot, ``wake_in`` is 0: send it as soon as a slot frees.
        """
        waiting = sorted((q for q in queues if q.count > 0), key=lambda q: q.oldest)
        flush: list[tuple[str, int]] = []
        wake_in: float | None = None
        for queue in waiting:
            sizes = self._batches(queue, now)
            room = max(0, free_slots - len(flush))
            flush.extend((queue.model, size) for size in sizes[:room])
            left = queue.count - sum(sizes[:room])
            if left <= 0:
                continue
            wait = 0.0 if len(sizes) > room else max(0.0, self.due_at(queue) - now)
            wake_in = wait if wake_in is None else min(wake_in, wait)
        return Plan(tuple(flush), wake_in)

    def _batches(self, queue: Waiting, now: float) -> list[int]:
        """The batch sizes that ``queue`` should send now: full ones, then a due remainder."""
        limit = self.limit(queue.capacity)
        full, rest = divmod(queue.count, limit)
        sizes = [limit] * full
        if rest and now >= self.due_at(queue):
            sizes.append(rest)
        return sizes


def is_expired(deadline_ms: int, now_ms: int) -> bool:
    """A request with a deadline (``deadline_ms`` > 0) that has passed is no longer wanted."""
    return 0 < deadline_ms <= now_ms
