"""The batching policy: full batches leave at once, partial ones when their time comes."""

from __future__ import annotations

import math

import pytest

from ferry.batching.policy import BatchPolicy, Plan, Waiting, is_expired

POLICY = BatchPolicy(max_batch=4, max_wait_s=0.05)


def queue(model: str, count: int, oldest: float, capacity: int = 64) -> Waiting:
    return Waiting(model=model, count=count, oldest=oldest, capacity=capacity)


# --- limit / due_at / ready ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [(64, 4), (4, 4), (3, 3), (1, 1), (0, 1), (-5, 1)],
)
def test_limit_is_max_batch_capped_by_capacity_and_at_least_one(capacity: int,
                                                                 expected: int) -> None:
    assert POLICY.limit(capacity) == expected


def test_due_at_is_oldest_arrival_plus_max_wait() -> None:
    policy = BatchPolicy(max_batch=8, max_wait_s=2.5)
    assert policy.due_at(queue("m", 1, oldest=10.0)) == 12.5


def test_ready_when_full_even_before_due() -> None:
    assert POLICY.ready(queue("m", 4, oldest=100.0), now=100.0) is True


def test_ready_when_count_exceeds_capacity_limited_batch() -> None:
    assert POLICY.ready(queue("m", 2, oldest=100.0, capacity=2), now=100.0) is True


def test_partial_not_ready_before_due() -> None:
    assert POLICY.ready(queue("m", 3, oldest=100.0), now=100.049) is False


def test_partial_ready_exactly_at_due_and_after() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=0.5)
    assert policy.ready(queue("m", 1, oldest=10.0), now=10.5) is True
    assert policy.ready(queue("m", 1, oldest=10.0), now=11.0) is True


@pytest.mark.parametrize("count", [0, -1])
def test_empty_queue_is_never_ready(count: int) -> None:
    assert POLICY.ready(queue("m", count, oldest=0.0), now=math.inf) is False


# --- plan -----------------------------------------------------------------------------------------


def test_empty_input_gives_no_flush_and_no_wake() -> None:
    assert POLICY.plan([], now=0.0, free_slots=4) == Plan(flush=(), wake_in=None)


def test_queues_with_nothing_waiting_are_ignored() -> None:
    plan = POLICY.plan([queue("m", 0, oldest=0.0)], now=100.0, free_slots=4)
    assert plan == Plan(flush=(), wake_in=None)


def test_full_batch_flushes_at_once() -> None:
    plan = POLICY.plan([queue("m", 4, oldest=10.0)], now=10.0, free_slots=2)
    assert plan == Plan(flush=(("m", 4),), wake_in=None)


def test_partial_batch_waits_until_max_wait_since_oldest() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=0.5)
    plan = policy.plan([queue("m", 3, oldest=10.0)], now=10.25, free_slots=2)
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.25)


def test_partial_batch_flushes_once_due() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=0.5)
    plan = policy.plan([queue("m", 3, oldest=10.0)], now=10.5, free_slots=2)
    assert plan == Plan(flush=(("m", 3),), wake_in=None)


def test_wake_in_is_time_until_the_next_due_departure() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=1.0)
    queues = [queue("late", 1, oldest=10.5), queue("early", 2, oldest=10.2)]
    plan = policy.plan(queues, now=10.6, free_slots=4)
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.6)  # early is due at 11.2


def test_several_full_batches_in_one_queue_all_leave() -> None:
    plan = POLICY.plan([queue("m", 9, oldest=10.0)], now=10.0, free_slots=8)
    assert plan.flush == (("m", 4), ("m", 4))
    # the remainder of one is not due yet: wake when it is (due_at of the oldest arrival)
    assert plan.wake_in == pytest.approx(0.05)


def test_full_batches_and_due_remainder_all_leave() -> None:
    plan = POLICY.plan([queue("m", 9, oldest=10.0)], now=11.0, free_slots=8)
    assert plan == Plan(flush=(("m", 4), ("m", 4), ("m", 1)), wake_in=None)


def test_capacity_caps_the_batch() -> None:
    policy = BatchPolicy(max_batch=64, max_wait_s=1.0)
    plan = policy.plan([queue("small", 5, oldest=0.0, capacity=2)], now=0.0, free_slots=8)
    assert plan.flush == (("small", 2), ("small", 2))
    assert plan.wake_in == pytest.approx(1.0)


def test_free_slots_limit_the_batches_and_wake_in_is_zero() -> None:
    plan = POLICY.plan([queue("m", 12, oldest=10.0)], now=10.0, free_slots=2)
    assert plan == Plan(flush=(("m", 4), ("m", 4)), wake_in=0.0)


def test_no_free_slot_with_a_due_batch_wakes_immediately() -> None:
    plan = POLICY.plan([queue("m", 2, oldest=10.0)], now=20.0, free_slots=0)
    assert plan == Plan(flush=(), wake_in=0.0)


def test_no_free_slot_and_nothing_due_waits_for_due_time() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=1.0)
    plan = policy.plan([queue("m", 2, oldest=10.0)], now=10.25, free_slots=0)
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.75)


def test_negative_free_slots_behave_like_zero() -> None:
    plan = POLICY.plan([queue("m", 4, oldest=10.0)], now=10.0, free_slots=-3)
    assert plan == Plan(flush=(), wake_in=0.0)


def test_most_overdue_queue_is_served_first() -> None:
    queues = [queue("b", 2, oldest=5.0), queue("a", 1, oldest=1.0), queue("c", 3, oldest=3.0)]
    plan = POLICY.plan(queues, now=100.0, free_slots=8)
    assert plan == Plan(flush=(("a", 1), ("c", 3), ("b", 2)), wake_in=None)


def test_most_overdue_queue_gets_the_only_free_slot() -> None:
    queues = [queue("young", 2, oldest=50.0), queue("old", 1, oldest=1.0)]
    plan = POLICY.plan(queues, now=100.0, free_slots=1)
    assert plan == Plan(flush=(("old", 1),), wake_in=0.0)


def test_full_and_partial_queues_together() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=1.0)
    queues = [queue("partial", 2, oldest=9.5), queue("full", 4, oldest=9.9)]
    plan = policy.plan(queues, now=10.0, free_slots=4)
    assert plan.flush == (("full", 4),)
    assert plan.wake_in == pytest.approx(0.5)


def test_draining_with_now_infinite_flushes_everything() -> None:
    queues = [queue("a", 9, oldest=10.0), queue("b", 1, oldest=20.0),
              queue("c", 3, oldest=30.0, capacity=2)]
    plan = POLICY.plan(queues, now=math.inf, free_slots=100)
    assert plan == Plan(
        flush=(("a", 4), ("a", 4), ("a", 1), ("b", 1), ("c", 2), ("c", 1)), wake_in=None)


def test_draining_without_enough_slots_wakes_immediately() -> None:
    plan = POLICY.plan([queue("a", 3, oldest=10.0), queue("b", 1, oldest=20.0)],
                       now=math.inf, free_slots=1)
    assert plan == Plan(flush=(("a", 3),), wake_in=0.0)


def test_plan_accepts_any_iterable() -> None:
    plan = POLICY.plan(iter([queue("m", 4, oldest=0.0)]), now=0.0, free_slots=1)
    assert plan.flush == (("m", 4),)


# --- is_expired ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline_ms", "now_ms", "expected"),
    [
        (0, 10**15, False),  # no deadline
        (-1, 10**15, False),
        (1000, 999, False),
        (1000, 1000, True),
        (1000, 1001, True),
    ],
)
def test_is_expired(deadline_ms: int, now_ms: int, expected: bool) -> None:
    assert is_expired(deadline_ms, now_ms) is expected
