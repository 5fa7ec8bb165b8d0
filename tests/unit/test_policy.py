"""The batching policy: full batches leave at once, partial ones when their time comes, or early
when the backend is idle and nobody else is coming."""

from __future__ import annotations

import pytest

from ferry.priority import Priority
from ferry.rules.policy import (
    Backend,
    BatchPolicy,
    Departure,
    Lane,
    Plan,
    Reason,
    Waiting,
)

FULL, WAIT, ADAPTIVE, DRAIN = Reason.FULL, Reason.WAIT, Reason.ADAPTIVE, Reason.DRAIN
POLICY = BatchPolicy(max_batch=4, max_wait_s=0.05, adaptive=False)


def queue(model: str, count: int, oldest: float, capacity: int = 64,
          newest: float | None = None, suspect: bool = False) -> Waiting:
    return Waiting(Lane(model, suspect=suspect), count, oldest,
                   oldest if newest is None else newest, capacity)


def free(slots: int, *models: str, rate: float = 0.0, fixed_s: float = 0.0
         ) -> dict[str, Backend]:
    return {m: Backend(slots, rate, fixed_s) for m in models or ("m",)}


def leave(model: str, size: int, reason: Reason, suspect: bool = False) -> Departure:
    return Departure(Lane(model, suspect=suspect), size, reason)


# --- limit / due_at -------------------------------------------------------------------------------


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


# --- the classic rule: full, or max wait since the first (adaptive flush off) ---------------------


def test_empty_input_gives_no_flush_and_no_wake() -> None:
    assert POLICY.plan([], now=0.0, backends=free(4)) == Plan(flush=(), wake_in=None)


def test_queues_with_nothing_waiting_are_ignored() -> None:
    plan = POLICY.plan([queue("m", 0, oldest=0.0)], now=100.0, backends=free(4))
    assert plan == Plan(flush=(), wake_in=None)


def test_full_batch_flushes_at_once() -> None:
    plan = POLICY.plan([queue("m", 4, oldest=10.0)], now=10.0, backends=free(2))
    assert plan == Plan(flush=(leave("m", 4, FULL),), wake_in=None)


def test_capacity_smaller_than_max_batch_makes_a_full_batch() -> None:
    plan = POLICY.plan([queue("m", 2, oldest=100.0, capacity=2)], now=100.0, backends=free(1))
    assert plan.flush == (leave("m", 2, FULL),)


def test_partial_batch_waits_until_max_wait_since_oldest() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=0.5, adaptive=False)
    plan = policy.plan([queue("m", 3, oldest=10.0)], now=10.25, backends=free(2))
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.25)


def test_partial_batch_flushes_once_due() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=0.5, adaptive=False)
    assert policy.plan([queue("m", 3, oldest=10.0)], now=10.5, backends=free(2)) == Plan(
        flush=(leave("m", 3, WAIT),), wake_in=None)
    assert policy.plan([queue("m", 1, oldest=10.0)], now=11.0, backends=free(2)).flush == (
        leave("m", 1, WAIT),)


def test_wake_in_is_time_until_the_next_due_departure() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=1.0, adaptive=False)
    queues = [queue("late", 1, oldest=10.5), queue("early", 2, oldest=10.2)]
    plan = policy.plan(queues, now=10.6, backends=free(4, "late", "early"))
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.6)  # early is due at 11.2


def test_several_full_batches_in_one_queue_all_leave() -> None:
    plan = POLICY.plan([queue("m", 9, oldest=10.0)], now=10.0, backends=free(8))
    assert plan.flush == (leave("m", 4, FULL), leave("m", 4, FULL))
    # the remainder of one is not due yet: wake when it is (due_at of the oldest arrival)
    assert plan.wake_in == pytest.approx(0.05)


def test_full_batches_and_due_remainder_all_leave() -> None:
    plan = POLICY.plan([queue("m", 9, oldest=10.0)], now=11.0, backends=free(8))
    assert plan == Plan(flush=(leave("m", 4, FULL), leave("m", 4, FULL), leave("m", 1, WAIT)),
                        wake_in=None)


def test_capacity_caps_the_batch() -> None:
    policy = BatchPolicy(max_batch=64, max_wait_s=1.0, adaptive=False)
    plan = policy.plan([queue("small", 5, oldest=0.0, capacity=2)], now=0.0,
                       backends=free(8, "small"))
    assert plan.flush == (leave("small", 2, FULL), leave("small", 2, FULL))
    assert plan.wake_in == pytest.approx(1.0)


def test_free_slots_limit_the_batches_and_wake_in_is_zero() -> None:
    plan = POLICY.plan([queue("m", 12, oldest=10.0)], now=10.0, backends=free(2))
    assert plan == Plan(flush=(leave("m", 4, FULL), leave("m", 4, FULL)), wake_in=0.0)


def test_no_free_slot_with_a_due_batch_wakes_immediately() -> None:
    plan = POLICY.plan([queue("m", 2, oldest=10.0)], now=20.0, backends=free(0))
    assert plan == Plan(flush=(), wake_in=0.0)


def test_no_free_slot_and_nothing_due_waits_for_due_time() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=1.0, adaptive=False)
    plan = policy.plan([queue("m", 2, oldest=10.0)], now=10.25, backends=free(0))
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.75)


def test_negative_free_slots_behave_like_zero() -> None:
    plan = POLICY.plan([queue("m", 4, oldest=10.0)], now=10.0, backends=free(-3))
    assert plan == Plan(flush=(), wake_in=0.0)


def test_a_model_without_backend_state_gets_no_slot() -> None:
    plan = POLICY.plan([queue("unknown", 4, oldest=10.0)], now=10.0, backends={})
    assert plan == Plan(flush=(), wake_in=0.0)


def test_most_overdue_queue_is_served_first() -> None:
    queues = [queue("b", 2, oldest=5.0), queue("a", 1, oldest=1.0), queue("c", 3, oldest=3.0)]
    plan = POLICY.plan(queues, now=100.0, backends=free(8, "a", "b", "c"))
    assert plan == Plan(flush=(leave("a", 1, WAIT), leave("c", 3, WAIT), leave("b", 2, WAIT)),
                        wake_in=None)


def test_lanes_of_one_model_share_its_slots_oldest_first() -> None:
    queues = [queue("m", 2, oldest=50.0), queue("m", 1, oldest=1.0, capacity=1, suspect=True)]
    plan = POLICY.plan(queues, now=100.0, backends=free(1))
    assert plan == Plan(flush=(leave("m", 1, FULL, suspect=True),), wake_in=0.0)  # alone: full


def test_slots_are_per_model() -> None:
    queues = [queue("a", 4, oldest=1.0), queue("a", 4, oldest=2.0, suspect=True),
              queue("b", 4, oldest=3.0)]
    plan = POLICY.plan(queues, now=3.0, backends={"a": Backend(1), "b": Backend(1)})
    assert plan.flush == (leave("a", 4, FULL), leave("b", 4, FULL))
    assert plan.wake_in == 0.0  # a's suspects wait for a's slot


def test_full_and_partial_queues_together() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=1.0, adaptive=False)
    queues = [queue("partial", 2, oldest=9.5), queue("full", 4, oldest=9.9)]
    plan = policy.plan(queues, now=10.0, backends=free(4, "partial", "full"))
    assert plan.flush == (leave("full", 4, FULL),)
    assert plan.wake_in == pytest.approx(0.5)


def test_draining_flushes_everything_that_has_a_slot() -> None:
    queues = [queue("a", 9, oldest=10.0), queue("b", 1, oldest=20.0),
              queue("c", 3, oldest=30.0, capacity=2)]
    plan = POLICY.plan(queues, now=30.0, backends=free(100, "a", "b", "c"), draining=True)
    assert plan == Plan(flush=(leave("a", 4, FULL), leave("a", 4, FULL), leave("a", 1, DRAIN),
                               leave("b", 1, DRAIN), leave("c", 2, FULL), leave("c", 1, DRAIN)),
                        wake_in=None)


def test_draining_without_enough_slots_wakes_immediately() -> None:
    plan = POLICY.plan([queue("a", 3, oldest=10.0), queue("a", 1, oldest=20.0, suspect=True)],
                       now=20.0, backends=free(1, "a"), draining=True)
    assert plan == Plan(flush=(leave("a", 3, DRAIN),), wake_in=0.0)


def test_plan_accepts_any_iterable() -> None:
    plan = POLICY.plan(iter([queue("m", 4, oldest=0.0)]), now=0.0, backends=free(1))
    assert plan.flush == (leave("m", 4, FULL),)


# --- adaptive flush -------------------------------------------------------------------------------

ADAPT = BatchPolicy(max_batch=64, max_wait_s=0.05)


def test_a_lone_request_leaves_at_once_when_nothing_else_is_expected() -> None:
    # 10/s: the next request is expected 100 ms after this one, and waiting could save 4 ms
    plan = ADAPT.plan([queue("m", 1, oldest=5.0)], now=5.0,
                      backends=free(1, rate=10.0, fixed_s=0.004))
    assert plan == Plan(flush=(leave("m", 1, ADAPTIVE),), wake_in=None)


def test_with_no_arrival_rate_known_a_free_backend_takes_what_waits() -> None:
    plan = ADAPT.plan([queue("m", 3, oldest=5.0)], now=5.0, backends=free(1))
    assert plan.flush == (leave("m", 3, ADAPTIVE),)


def test_it_waits_for_a_passenger_expected_within_what_waiting_saves() -> None:
    # 400/s: the next is expected 2.5 ms after the last; one call's fixed cost is 4 ms
    plan = ADAPT.plan([queue("m", 1, oldest=5.0)], now=5.0,
                      backends=free(1, rate=400.0, fixed_s=0.004))
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.0025)  # look again when that passenger is overdue


def test_the_more_aboard_the_less_one_more_is_worth_waiting_for() -> None:
    backends = free(1, rate=400.0, fixed_s=0.004)
    # 2 aboard: saving 2 ms each is not worth the 2.5 ms expected wait
    plan = ADAPT.plan([queue("m", 2, oldest=4.99, newest=5.0)], now=5.0, backends=backends)
    assert plan.flush == (leave("m", 2, ADAPTIVE),)


def test_an_overdue_passenger_is_not_waited_for() -> None:
    plan = ADAPT.plan([queue("m", 1, oldest=5.0)], now=5.003,
                      backends=free(1, rate=400.0, fixed_s=0.004))
    assert plan.flush == (leave("m", 1, ADAPTIVE),)


def test_no_adaptive_departure_without_a_free_slot() -> None:
    plan = ADAPT.plan([queue("m", 1, oldest=5.0)], now=5.0,
                      backends=free(0, rate=10.0, fixed_s=0.004))
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.05)  # the max wait still applies


def test_full_batches_use_the_slots_before_the_remainder_may_leave_early() -> None:
    policy = BatchPolicy(max_batch=4, max_wait_s=0.05)
    plan = policy.plan([queue("m", 5, oldest=5.0)], now=5.0, backends=free(1, rate=1.0))
    assert plan.flush == (leave("m", 4, FULL),)
    plan = policy.plan([queue("m", 5, oldest=5.0)], now=5.0, backends=free(2, rate=1.0))
    assert plan.flush == (leave("m", 4, FULL), leave("m", 1, ADAPTIVE))


def test_adaptive_never_waits_past_max_wait() -> None:
    # a busy stream of arrivals keeps the next passenger "expected", but the first has waited
    plan = ADAPT.plan([queue("m", 3, oldest=5.0, newest=5.0499)], now=5.05,
                      backends=free(1, rate=10_000.0, fixed_s=0.5))
    assert plan.flush == (leave("m", 3, WAIT),)
    waiting = ADAPT.plan([queue("m", 3, oldest=5.0, newest=5.03)], now=5.04,
                         backends=free(1, rate=10.0, fixed_s=0.5))
    assert waiting.flush == ()
    assert waiting.wake_in == pytest.approx(0.01)  # due before the next passenger's expected time


def test_adaptive_off_keeps_the_classic_rule() -> None:
    classic = BatchPolicy(max_batch=64, max_wait_s=0.05, adaptive=False)
    plan = classic.plan([queue("m", 1, oldest=5.0)], now=5.0, backends=free(1, rate=1.0))
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.05)


# --- priorities and ageing ------------------------------------------------------------------------


def prio_queue(priority: Priority, count: int, oldest: float) -> Waiting:
    return Waiting(Lane("m", priority), count, oldest, oldest, 64)


def test_higher_priority_takes_the_free_slot_though_younger() -> None:
    policy = BatchPolicy(max_batch=64, max_wait_s=0.05, aging_s=2.0)
    queues = [prio_queue(Priority.LOW, 64, oldest=1.0), prio_queue(Priority.HIGH, 64, oldest=1.5),
              prio_queue(Priority.NORMAL, 64, oldest=1.2)]
    plan = policy.plan(queues, now=1.6, backends=free(1))
    assert [d.lane.priority for d in plan.flush] == [Priority.HIGH]
    assert plan.wake_in == 0  # the others wait for a slot
    two = policy.plan(queues, now=1.6, backends=free(3))
    assert [d.lane.priority for d in two.flush] == [Priority.HIGH, Priority.NORMAL, Priority.LOW]


def test_an_aged_queue_goes_ahead_of_normal_but_never_of_high_priority() -> None:
    policy = BatchPolicy(max_batch=64, max_wait_s=0.05, aging_s=2.0)
    queues = [prio_queue(Priority.NORMAL, 64, oldest=9.0), prio_queue(Priority.LOW, 64, oldest=7.9)]
    plan = policy.plan(queues, now=9.95, backends=free(1))
    assert [d.lane.priority for d in plan.flush] == [Priority.LOW]  # waited 2.05 s
    queues.append(prio_queue(Priority.HIGH, 1, oldest=9.9))
    plan = policy.plan(queues, now=9.95, backends=free(1))
    assert [d.lane.priority for d in plan.flush] == [Priority.HIGH]  # the next batch, always
    two = policy.plan(queues, now=9.95, backends=free(2))
    assert [d.lane.priority for d in two.flush] == [Priority.HIGH, Priority.LOW]


def test_batch_work_never_ages_ahead_of_interactive_work() -> None:
    """A bulk job's items wait as long as interactive work keeps the slots busy: they fill."""
    policy = BatchPolicy(max_batch=64, max_wait_s=0.05, aging_s=2.0)
    queues = [prio_queue(Priority.BATCH, 64, oldest=1.0), prio_queue(Priority.LOW, 64, oldest=9.0)]
    plan = policy.plan(queues, now=9.95, backends=free(1))
    assert [d.lane.priority for d in plan.flush] == [Priority.LOW]  # batch waited 8.95 s
    two = policy.plan(queues, now=9.95, backends=free(2))
    assert [d.lane.priority for d in two.flush] == [Priority.LOW, Priority.BATCH]


def test_aged_queues_go_oldest_first() -> None:
    policy = BatchPolicy(max_batch=64, max_wait_s=0.05, aging_s=1.0)
    queues = [prio_queue(Priority.NORMAL, 64, oldest=1.0), prio_queue(Priority.LOW, 64, oldest=0.5)]
    plan = policy.plan(queues, now=5.0, backends=free(1))
    assert [d.lane.priority for d in plan.flush] == [Priority.LOW]


def test_a_waiting_high_priority_queue_leaves_rather_than_let_low_priority_take_its_slot() -> None:
    """High priority rides the next batch: it would wait for more passengers (arrivals are
    frequent), but the one free slot would then go to a full low-priority batch."""
    policy = BatchPolicy(max_batch=8, max_wait_s=0.05)
    high = Waiting(Lane("m", Priority.HIGH), 1, oldest=10.0, newest=10.0, capacity=8)
    low = prio_queue(Priority.LOW, 8, oldest=9.99)
    busy = {"m": Backend(free=1, rate=500.0, fixed_s=0.05)}
    alone = policy.plan([high], now=10.0005, backends=busy)
    assert alone.flush == ()  # alone, it waits for company
    plan = policy.plan([high, low], now=10.0005, backends=busy)
    assert plan.flush == (Departure(high.lane, 1, Reason.PRIORITY),)
    assert plan.wake_in == 0  # the low batch leaves when a slot frees
    same = Waiting(Lane("m", Priority.HIGH, signature=("other",)), 8, 9.99, 9.99, 8)  # its rank
    assert policy.plan([high, same], now=10.0005, backends=busy).flush == (
        Departure(same.lane, 8, Reason.FULL),)


# --- a slot that frees after every one was busy ---------------------------------------------------


def test_under_load_what_waited_for_a_freed_slot_leaves_at_once_though_more_are_coming() -> None:
    # 600/s where t(B) = 40 + 1·B ms: full batches of 64 serve 615/s, greedy batching takes 60
    # at once. Adaptive alone would wait 1.7 ms for the next passenger, the instance idle
    loaded = {"m": Backend(1, 600.0, 0.040, 0.001, freed=True)}
    plan = ADAPT.plan([queue("m", 30, oldest=5.0)], now=5.0, backends=loaded)  # half of it
    assert plan == Plan(flush=(leave("m", 30, Reason.FREED),), wake_in=None)


def test_a_handful_short_of_the_greedy_batch_waits_for_company_though_the_slot_freed() -> None:
    loaded = {"m": Backend(1, 600.0, 0.040, 0.001, freed=True)}
    plan = ADAPT.plan([queue("m", 5, oldest=5.0)], now=5.0, backends=loaded)
    assert plan.flush == ()


def test_at_light_load_a_freed_slot_still_waits_for_a_passenger_worth_it() -> None:
    # 400/s where full batches serve 16,000/s; the next passenger, 2.5 ms away, saves 4 ms
    light = {"m": Backend(1, 400.0, 0.004, freed=True)}
    plan = ADAPT.plan([queue("m", 1, oldest=5.0)], now=5.0, backends=light)
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.0025)


def test_a_slot_taken_from_the_fleets_budget_takes_the_queue_whatever_its_size_or_load() -> None:
    # The handful and the light load above wait for company on a slot of their own; a slot of
    # the fleet's shared budget, taken for them, leaves at once: its batch is the fleet's queue.
    for backend in (Backend(1, 600.0, 0.040, 0.001, freed=True, taken=True),
                    Backend(1, 400.0, 0.004, freed=True, taken=True)):
        plan = ADAPT.plan([queue("m", 5, oldest=5.0)], now=5.0, backends={"m": backend})
        assert plan.flush == (leave("m", 5, Reason.FREED),)


def test_with_the_adaptive_flush_off_a_freed_slot_keeps_the_classic_rule() -> None:
    plan = POLICY.plan([queue("m", 2, oldest=5.0)], now=5.001,
                       backends={"m": Backend(1, 600.0, 0.040, 0.001, freed=True)})
    assert plan.flush == ()
    assert plan.wake_in == pytest.approx(0.049)


def test_a_freed_slot_is_still_a_slot_no_departure_without_one() -> None:
    plan = ADAPT.plan([queue("m", 60, oldest=5.0)], now=5.001,
                      backends={"m": Backend(0, 600.0, 0.040, 0.001, freed=True)})
    assert plan.flush == ()


def test_a_due_batch_names_its_wait_not_the_freed_slot() -> None:
    plan = ADAPT.plan([queue("m", 60, oldest=5.0)], now=5.06,
                      backends={"m": Backend(1, 600.0, 0.040, 0.001, freed=True)})
    assert plan.flush == (leave("m", 60, WAIT),)
