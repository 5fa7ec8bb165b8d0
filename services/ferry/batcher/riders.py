"""The batcher's boarded work as its share of the fleet's one queue (``budget.Boarding``): what
it offers while it waits for a slot of a model's shared budget, what it drops when another
batcher's slot took it, and how it brings aboard the riders its own slot takes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from ferry.batcher.shared import Aboard, Signals
from ferry.priority import Priority
from ferry.queue.base import Delivery, TaskQueue
from ferry.rules.policy import RANKS
from ferry.telemetry.metrics import BatcherMetrics

# An offer's place in the model's set: high priority first, then oldest first (enqueued ms).
PRIORITY_SPAN = 1e13


def member(delivery: Delivery) -> str:
    return f"{delivery.stream}|{delivery.entry_id}"


class FleetBoarding:
    """Offers, drops and takes riders for the budget, over the batcher's boarded work."""

    def __init__(self, aboard: Aboard, signals: Signals, queue: TaskQueue,
                 metrics: BatcherMetrics, *, capacity: Callable[[str], int],
                 board: Callable[[Sequence[Delivery]], Awaitable[None]]) -> None:
        self.aboard = aboard
        self.signals = signals
        self.queue = queue
        self.metrics = metrics
        self.capacity = capacity  # the model's largest batch
        self.board = board  # the reader's boarding, as for what it reads

    def offers(self, model: str) -> list[tuple[str, float]]:
        """The model's boarded tasks, but those that travel alone (delivered before)."""
        return [(member(d), (RANKS[Priority.HIGH] - RANKS[lane.priority]) * PRIORITY_SPAN
                 + d.task.enqueued_at_ms)
                for lane, d in self.aboard.items(model)
                if not lane.suspect and d.task is not None]

    def room(self, model: str) -> int:
        aboard = self.aboard.count_by(lambda lane: lane.model).get(model, 0)
        return max(0, self.capacity(model) - aboard)

    def largest(self, model: str) -> int:
        return self.capacity(model)

    def waiting(self, model: str) -> bool:
        return self.aboard.holds(model)

    def gone(self, model: str, members: set[str]) -> None:
        removed = self.aboard.drop(
            lambda d: d.task is not None and d.task.model == model and member(d) in members)
        if removed:
            self.metrics.buffered.set(len(self.aboard))
            self.signals.unboarded()

    async def riders(self, model: str, riders: list[tuple[str, str, str]]) -> None:
        moved = await self.queue.take_riders(riders)
        fresh = [d for d in moved if not self.aboard.is_held(d)]
        if fresh:
            self.metrics.budget_riders.labels(model).inc(len(fresh))
            await self.board(fresh)
