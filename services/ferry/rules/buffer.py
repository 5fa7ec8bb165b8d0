"""Requests that have boarded, per lane, in arrival order; taken in arrival order, or, when a
lane holds more than a batch of several flows (clients), in turns between them."""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ferry.rules.policy import Lane, Waiting

T = TypeVar("T")
K = TypeVar("K")


@dataclass(frozen=True)
class Boarded(Generic[T]):
    item: T
    arrived: float
    due: float | None = None  # when it should be answered (deadline or SLO), on the same clock


class BoardingBuffer(Generic[T]):
    """FIFO queues of items keyed by lane, with arrival and due times for the policy.

    With ``flow`` (an item's client), a batch taken from a lane that holds more than it, of
    several flows, takes the flows in turns (each one's first, then each one's second, ...;
    in arrival order within a flow and within the batch): what Redis sent in fair order is not
    served first come, first served here (docs/fairness.md). Everything read is still served,
    so the shares are Redis's; only the batch a task rides changes."""

    def __init__(self, flow: Callable[[T], str] | None = None) -> None:
        self._queues: dict[Lane, deque[Boarded[T]]] = {}
        self._due: dict[Lane, float] = {}  # each lane's earliest due time, where one is set
        self._flow = flow
        self._flows: dict[Lane, Counter[str]] = {}  # each lane's items per flow, with ``flow``

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def add(self, lane: Lane, item: T, arrived: float, due: float | None = None) -> None:
        """``item`` boards its lane in arrival order: after every item that arrived no later
        (one that arrived before the lane's last, such as a task another batcher held, goes in
        front of those that came after it)."""
        queue = self._queues.setdefault(lane, deque())
        boarded = Boarded(item, arrived, due)
        if queue and arrived < queue[-1].arrived:
            bisect.insort(queue, boarded, key=_arrived)  # every lane is in arrival order
        else:
            queue.append(boarded)
        if due is not None and due < self._due.get(lane, math.inf):
            self._due[lane] = due
        if self._flow is not None:
            self._flows.setdefault(lane, Counter())[self._flow(item)] += 1

    def count_by(self, key: Callable[[Lane], K]) -> dict[K, int]:
        """Items waiting, summed by ``key`` of their lane."""
        counts: dict[K, int] = {}
        for lane, queue in self._queues.items():
            counts[key(lane)] = counts.get(key(lane), 0) + len(queue)
        return counts

    def holds(self, model: str) -> bool:
        """Whether a task of ``model`` is boarded (in any of its lanes)."""
        return any(lane.model == model and queue for lane, queue in self._queues.items())

    def take(self, lane: Lane, count: int) -> list[T]:
        """Remove and return up to ``count`` of ``lane``'s oldest items."""
        queue = self._queues.get(lane)
        if not queue:
            return []
        flows = self._flows.get(lane)
        if flows is not None and count < len(queue) and len(flows) > 1:
            taken = self._in_turns(queue, count)
        else:
            taken = [queue.popleft() for _ in range(min(count, len(queue)))]
        if flows is not None:
            assert self._flow is not None
            flows.subtract(self._flow(b.item) for b in taken)
            for name in [name for name, left in flows.items() if left <= 0]:
                del flows[name]
        if not queue:
            del self._queues[lane]
            self._flows.pop(lane, None)
        if lane in self._due and any(b.due is not None for b in taken):
            self._refresh_due(lane)
        return [boarded.item for boarded in taken]

    def _in_turns(self, queue: deque[Boarded[T]], count: int) -> list[Boarded[T]]:
        """``count`` of the lane's items, the flows taking turns; the rest stay in order."""
        assert self._flow is not None
        turns: Counter[str] = Counter()
        order = []
        for index, boarded in enumerate(queue):
            flow = self._flow(boarded.item)
            order.append((turns[flow], index))
            turns[flow] += 1
        chosen = {index for _, index in sorted(order)[:count]}
        taken = [b for index, b in enumerate(queue) if index in chosen]
        rest = [b for index, b in enumerate(queue) if index not in chosen]
        queue.clear()
        queue.extend(rest)
        return taken

    def _refresh_due(self, lane: Lane) -> None:
        dues = [b.due for b in self._queues.get(lane, ()) if b.due is not None]
        if dues:
            self._due[lane] = min(dues)
        else:
            self._due.pop(lane, None)

    def views(self, capacity: Callable[[Lane], int]) -> Iterator[Waiting]:
        """What each queue looks like to the policy; ``capacity`` gives a lane's largest batch."""
        for lane, queue in self._queues.items():
            yield Waiting(lane, len(queue), queue[0].arrived, queue[-1].arrived, capacity(lane),
                          self._due.get(lane))

    def items(self, model: str) -> Iterator[tuple[Lane, T]]:
        """The items of ``model``'s lanes, each with its lane, in arrival order per lane."""
        for lane, queue in self._queues.items():
            if lane.model == model:
                for boarded in queue:
                    yield lane, boarded.item

    def remove(self, unwanted: Callable[[T], bool]) -> list[T]:
        """Remove and return the items ``unwanted`` picks, wherever they wait."""
        removed: list[T] = []
        for lane in list(self._queues):
            queue = self._queues[lane]
            kept = deque(b for b in queue if not unwanted(b.item))
            if len(kept) != len(queue):
                removed += [b.item for b in queue if unwanted(b.item)]
                if kept:
                    self._queues[lane] = kept
                else:
                    del self._queues[lane]
                if self._flow is not None and kept:
                    self._flows[lane] = Counter(self._flow(b.item) for b in kept)
                else:
                    self._flows.pop(lane, None)
                self._refresh_due(lane)
        return removed

    def drain(self) -> list[T]:
        """Remove and return everything, oldest first within each queue."""
        items = [boarded.item for queue in self._queues.values() for boarded in queue]
        self._queues.clear()
        self._due.clear()
        self._flows.clear()
        return items

    def lanes(self) -> list[Lane]:
        return list(self._queues)


def _arrived(boarded: Boarded[T]) -> float:
    return boarded.arrived
