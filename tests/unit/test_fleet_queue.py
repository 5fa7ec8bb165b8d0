"""The fleet's one queue, its pure parts: what a batcher offers of its boarded tasks and in what
order, what it drops when another batcher took them, and how a shared budget changes what the
policy plans a model with (the fleet's arrival rate, a slot to ask for, a slot taken)."""

from __future__ import annotations

import asyncio

from ferry.batcher.models import ModelState
from ferry.batcher.riders import PRIORITY_SPAN, FleetBoarding, member
from ferry.batcher.shared import Aboard, Signals
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.rules.breaker import CircuitBreaker
from ferry.rules.estimators import Window
from ferry.rules.policy import Lane
from ferry.telemetry.metrics import BatcherMetrics
from ferry.v1.task_pb2 import Task


def boarded(aboard: Aboard, name: str, priority: Priority, enqueued_ms: int,
            deliveries: int = 1) -> Delivery:
    task = Task(task_id=name, model="m", payload=b"x", priority=priority.value,
                enqueued_at_ms=enqueued_ms)
    delivery = Delivery(0, "s", f"{name}-0", b"", task, deliveries=deliveries)
    aboard.board(Lane("m", priority, deliveries > 1), delivery, 0.0, None)
    return delivery


def boarding(aboard: Aboard, signals: Signals) -> FleetBoarding:
    async def board(_: object) -> None:
        raise AssertionError("not boarding here")

    return FleetBoarding(aboard, signals, None, BatcherMetrics(),  # type: ignore[arg-type]
                         capacity=lambda model: 8, board=board)


def test_offers_go_high_priority_first_then_oldest_and_a_suspect_travels_alone() -> None:
    aboard = Aboard()
    old = boarded(aboard, "old", Priority.NORMAL, 1_000)
    urgent = boarded(aboard, "urgent", Priority.HIGH, 5_000)
    boarded(aboard, "again", Priority.NORMAL, 500, deliveries=2)  # delivered before: alone
    offers = sorted(boarding(aboard, Signals()).offers("m"), key=lambda offer: offer[1])
    assert [m for m, _ in offers] == [member(urgent), member(old)]
    assert offers[1][1] - offers[0][1] > PRIORITY_SPAN / 2  # priority outranks any age


def test_room_is_the_batch_left_and_what_others_took_is_no_longer_held_here() -> None:
    aboard, signals = Aboard(), Signals()
    kept = boarded(aboard, "kept", Priority.NORMAL, 1_000)
    taken = boarded(aboard, "taken", Priority.NORMAL, 2_000)
    fleet = boarding(aboard, signals)
    assert fleet.room("m") == 6
    fleet.gone("m", {member(taken)})
    assert [d for _, d in aboard.items("m")] == [kept]
    assert aboard.held() == [kept.key]
    assert asyncio.run(signals.changed(0))  # the dispatcher plans without them


def state() -> ModelState:
    return ModelState(64, Window(2), lambda: CircuitBreaker(0.5, 10.0, 5, 1.0))


def test_a_shared_budget_plans_with_the_fleets_rate_and_a_slot_to_ask_for() -> None:
    model = state()
    model.rate.add(0.0, 100)
    model.inflight = 2  # both of its own slots busy: alone, nothing may leave
    alone = model.backend(1.0, holding=False)
    assert alone.free == 0 and not alone.taken
    fleet = model.backend(1.0, holding=False, shared=(0, False), fleet=4)
    assert fleet.free == 1 and not fleet.taken  # the budget, not this batcher, bounds it
    assert fleet.rate == 4 * alone.rate  # four batchers' arrivals share one queue
    granted = model.backend(1.0, holding=False, shared=(1, False), fleet=4)
    assert granted.free == 1 and granted.freed and granted.taken
    assert not model.backend(1.0, holding=False, shared=(1, False), fleet=1).taken
    assert model.backend(1.0, holding=True, shared=(1, False), fleet=4).free == 0
