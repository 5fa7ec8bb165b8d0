"""When a batcher whose batch is at Triton pulls the other batchers' offers: only in the last
stretch of the call's expected time (riders pulled sooner would only wait aboard, and each pull
is a Redis call and a wake-up), and at once for a batch whose time is not known yet."""

from __future__ import annotations

import pytest

from ferry.batcher.budget import PULL_LEAD, PULL_LEAD_MIN_S, Budget
from ferry.batcher.shared_budget import Slot


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def budget_with(clock: Clock, *slots: Slot) -> Budget:
    budget = Budget(None, limits=lambda model: {}, wake=lambda: None, clock=clock)
    budget.held.update(slots)  # batches of these slots are at Triton
    return budget


def test_a_batch_pulls_riders_only_in_the_last_stretch_of_its_call() -> None:
    clock = Clock()
    slot = Slot("m", "a:8001", "b1.x")
    budget = budget_with(clock, slot)
    budget.expect(slot, 0.2)
    lead = max(PULL_LEAD * 0.2, PULL_LEAD_MIN_S)
    assert budget.pulls_in("m") == pytest.approx(0.2 - lead)
    clock.now += 0.2 - lead
    assert budget.pulls_in("m") == 0.0
    clock.now += 0.5  # a call longer than expected: still pulling
    assert budget.pulls_in("m") == 0.0


def test_a_short_call_pulls_from_at_least_the_lead_before_its_end() -> None:
    clock = Clock()
    slot = Slot("m", "a:8001", "b1.x")
    budget = budget_with(clock, slot)
    budget.expect(slot, PULL_LEAD_MIN_S / 2)
    assert budget.pulls_in("m") == 0.0


def test_a_batch_without_an_expected_time_pulls_at_once() -> None:
    clock = Clock()
    timed, untimed = Slot("m", "a:8001", "b1.x"), Slot("m", "b:8001", "b1.y")
    budget = budget_with(clock, timed, untimed)
    budget.expect(timed, 0.3)
    assert budget.pulls_in("m") == 0.0  # the untimed batch may end any moment


def test_the_batch_that_ends_first_decides_and_a_freed_slot_forgets_its_window() -> None:
    clock = Clock()
    first, second = Slot("m", "a:8001", "b1.x"), Slot("m", "b:8001", "b1.y")
    budget = budget_with(clock, first, second)
    budget.expect(first, 0.1)
    clock.now += 0.05
    budget.expect(second, 0.2)
    assert budget.pulls_in("m") == pytest.approx(0.1 - 0.05 - max(PULL_LEAD * 0.1,
                                                                   PULL_LEAD_MIN_S))
    budget.give(first)
    assert budget.pulls_in("m") == pytest.approx(0.2 - max(PULL_LEAD * 0.2, PULL_LEAD_MIN_S))


def test_only_held_slots_of_the_model_count() -> None:
    clock = Clock()
    mine, other = Slot("m", "a:8001", "b1.x"), Slot("n", "a:8001", "b1.z")
    budget = budget_with(clock, mine, other)
    budget.expect(Slot("m", "a:8001", "gone"), 0.5)  # not held here: nothing to time
    budget.expect(mine, 0.4)
    assert budget.pulls_in("m") > 0.0
    assert budget.pulls_in("n") == 0.0
    assert budget.pulls_in("absent") == 0.0
