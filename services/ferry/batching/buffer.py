"""Requests that have boarded, per model, in arrival order."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ferry.batching.policy import Waiting

T = TypeVar("T")


@dataclass(frozen=True)
class Boarded(Generic[T]):
    item: T
    arrived: float


class BoardingBuffer(Generic[T]):
    """FIFO queues of items keyed by model, with arrival times for the policy."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Boarded[T]]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def add(self, model: str, item: T, arrived: float) -> None:
        self._queues.setdefault(model, deque()).append(Boarded(item, arrived))

    def take(self, model: str, count: int) -> list[T]:
        """Remove and return up to ``count`` of ``model``'s oldest items."""
        queue = self._queues.get(model)
        if not queue:
            return []
        taken = [queue.popleft().item for _ in range(min(count, len(queue)))]
        if not queue:
            del self._queues[model]
        return taken

    def views(self, capacity: Callable[[str], int]) -> Iterator[Waiting]:
        """What each queue looks like to the policy; ``capacity`` gives a queue's largest batch."""
        for key, queue in self._queues.items():
            yield Waiting(key, len(queue), queue[0].arrived, capacity(key))

    def drain(self) -> list[T]:
        """Remove and return everything, oldest first within each queue."""
        items = [boarded.item for queue in self._queues.values() for boarded in queue]
        self._queues.clear()
        return items

    def models(self) -> list[str]:
        return list(self._queues)
