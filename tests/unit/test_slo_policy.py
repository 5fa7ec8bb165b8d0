"""Deadline-aware batching: no batch waits past the last moment that answers its most urgent
request in time, and under load a free slot waits for a larger batch while another batch keeps
the backend busy and the deadline allows (``FERRY_SLO_MS``, or a request's own deadline)."""

from __future__ import annotations

import math

import pytest

from ferry.planner import arrivals
from ferry.planner.costs import CostModel
from ferry.planner.deployment import Deployment
from ferry.planner.simulate import simulate
from ferry.rules.policy import (
    GUARD_S,
    GUARD_SHARE,
    Backend,
    BatchPolicy,
    Departure,
    Lane,
    Reason,
    Waiting,
)

LANE = Lane("m")
FIXED, PER = 0.050, 0.002  # the slow backend's t(B) = 50 + 2·B ms
POLICY = BatchPolicy(max_batch=64, max_wait_s=0.05)


def waiting(count: int, oldest: float, due: float | None, newest: float | None = None
            ) -> Waiting:
    return Waiting(LANE, count, oldest, oldest if newest is None else newest, 64, due)


def backend(free: int, slots: int = 2, rate: float = 600.0) -> dict[str, Backend]:
    return {"m": Backend(free, rate, FIXED, PER, slots)}


def t(batch: int) -> float:
    return FIXED + PER * batch


def guard(span: float) -> float:
    """What a batch leaves after its call: 10 ms, or 15% of the time its oldest was given."""
    return max(GUARD_S, GUARD_SHARE * span)


def latest(due: float, aboard: int, newest: float, rate: float, span: float) -> float:
    """The policy's rule, spelled out: leave in time for a call of those aboard, one more, and
    those expected to board meanwhile (but never before a full batch would have to)."""
    slack = due - guard(span)
    grow = PER * rate
    growing = (slack - t(aboard + 1) + grow * newest) / (1 + grow)
    return min(slack - t(aboard + 1), max(growing, slack - t(64)))


def test_greedy_batch_is_where_a_slot_takes_what_arrived_during_its_share_of_a_call() -> None:
    b = Backend(1, 600.0, FIXED, PER, slots=2).greedy_batch()
    assert b == pytest.approx(37.5)  # 600/s · t(37.5) / 2 slots = 37.5
    assert b == pytest.approx(600.0 * t(round(b)) / 2, rel=0.02)
    assert Backend(1, 1000.0, FIXED, PER, slots=2).greedy_batch() == math.inf  # cannot keep up


def test_a_deadline_earlier_than_max_wait_sends_the_batch_in_time() -> None:
    """Max wait 1 s, adaptive off, one slot: only the deadline can send it early, leaving the
    call's fitted time and 15% of the 300 ms it was given for what follows the call."""
    policy = BatchPolicy(max_batch=64, max_wait_s=1.0, adaptive=False)
    queue = waiting(3, oldest=10.0, due=10.3)
    leave = latest(10.3, 3, newest=10.0, rate=600.0, span=0.3)
    assert leave < 10.3 - t(4) - guard(0.3)  # earlier: arrivals are expected meanwhile
    early = policy.plan([queue], now=10.05, backends=backend(1, slots=1))
    assert early.flush == ()
    assert early.wake_in == pytest.approx(leave - 10.05)
    due = policy.plan([queue], now=leave, backends=backend(1, slots=1))
    assert due.flush == (Departure(LANE, 3, Reason.DEADLINE),)


def test_without_a_due_time_nothing_changes() -> None:
    policy = BatchPolicy(max_batch=64, max_wait_s=1.0, adaptive=False)
    plan = policy.plan([waiting(3, oldest=10.0, due=None)], now=10.5, backends=backend(1))
    assert plan.flush == () and plan.wake_in == pytest.approx(0.5)


def test_under_load_a_free_slot_holds_past_max_wait_while_another_batch_is_at_the_backend(
) -> None:
    """600/s on two slots: greedy's batch of 37.5 makes two calls of 250 ms, more than 85% of a
    200 ms SLO, so the free slot waits for more passengers until the deadline calls."""
    queue = waiting(20, oldest=10.0, due=10.2, newest=10.06)
    plan = POLICY.plan([queue], now=10.061, backends=backend(1))
    assert plan.flush == ()  # past max wait (50 ms), and nobody is overdue
    leave = latest(10.2, 20, newest=10.06, rate=600.0, span=0.2)
    assert plan.wake_in == pytest.approx(leave - 10.061)
    late = POLICY.plan([queue], now=leave + 1e-6, backends=backend(1))
    assert late.flush == (Departure(LANE, 20, Reason.DEADLINE),)


def test_the_arrivals_it_waited_for_boarding_at_once_do_not_make_it_late() -> None:
    """Reads deliver in bursts: when those expected while it held board together at its
    departure time, that time has not moved into the past."""
    queue = waiting(20, oldest=10.0, due=10.2, newest=10.06)
    leave = latest(10.2, 20, newest=10.06, rate=600.0, span=0.2)
    grown = waiting(20 + round(600.0 * (leave - 10.06)), oldest=10.0, due=10.2, newest=leave)
    then = POLICY.latest(grown, backend(1)["m"], grown.count)
    assert then is not None and then >= leave - 0.003
    assert POLICY.latest(queue, backend(1)["m"], 20) == pytest.approx(leave)


def test_a_full_batch_leaves_while_the_rest_holds() -> None:
    queue = waiting(70, oldest=10.0, due=10.3, newest=10.02)
    plan = POLICY.plan([queue], now=10.06, backends=backend(1))
    assert plan.flush == (Departure(LANE, 64, Reason.FULL),)


def test_it_never_holds_when_nothing_is_at_the_backend() -> None:
    """Both slots free: holding would leave the GPU idle while work waits."""
    queue = waiting(20, oldest=10.0, due=10.2, newest=10.06)
    plan = POLICY.plan([queue], now=10.061, backends=backend(2))
    assert plan.flush == (Departure(LANE, 20, Reason.WAIT),)


def test_it_never_holds_with_a_single_slot() -> None:
    queue = waiting(20, oldest=10.0, due=10.2, newest=10.06)
    plan = POLICY.plan([queue], now=10.061, backends=backend(1, slots=1))
    assert plan.flush == (Departure(LANE, 20, Reason.WAIT),)


def test_at_light_load_greedy_holds_the_slo_and_nothing_is_held() -> None:
    """100/s: greedy's batch is about 3 and two calls take 111 ms, well inside 70% of 400 ms."""
    queue = waiting(3, oldest=10.0, due=10.4, newest=10.03)
    plan = POLICY.plan([queue], now=10.051, backends=backend(1, rate=100.0))
    assert plan.flush == (Departure(LANE, 3, Reason.WAIT),)


def test_nothing_is_held_before_a_call_was_timed() -> None:
    unknown = {"m": Backend(1, 600.0, 0.0, 0.0, slots=2)}
    plan = POLICY.plan([waiting(20, oldest=10.0, due=10.2, newest=10.06)], now=10.061,
                       backends=unknown)
    assert plan.flush == (Departure(LANE, 20, Reason.WAIT),)


def test_a_request_already_late_leaves_with_the_next_free_slot() -> None:
    plan = POLICY.plan([waiting(5, oldest=10.0, due=10.05)], now=10.01, backends=backend(1))
    assert plan.flush == (Departure(LANE, 5, Reason.DEADLINE),)
    none_free = POLICY.plan([waiting(5, oldest=10.0, due=10.05)], now=10.01,
                            backends=backend(0))
    assert none_free.flush == () and none_free.wake_in == 0


# --- the policy in the planner's simulation: goodput at the SLO ---------------------------------


def p99s(deployment: Deployment, qps: float, seeds: int = 5) -> list[float]:
    cost = CostModel(FIXED, PER, jitter_s=0.003)
    return [simulate(cost, deployment, arrivals.poisson(qps, 20.0, seed=seed), seed=seed).p99_s
            for seed in range(seeds)]


def test_with_the_slo_two_instances_hold_a_200_ms_p99_where_greedy_batching_cannot() -> None:
    """Slow backend, 2 instances (719/s at full batches), SLO 200 ms, at 66% of capacity:
    Triton's greedy rule (delay 0) and Ferry without the SLO miss it in every seeded run; with
    the SLO, the free instance waits for larger batches and every run holds it."""
    slo, qps = 0.200, 0.66 * 2 * 64 / t(64)
    greedy = p99s(Deployment(2, max_wait_s=0.0), qps)
    plain = p99s(Deployment(2), qps)
    aware = p99s(Deployment(2, slo_s=slo), qps)
    assert min(greedy) > slo and min(plain) > slo, (greedy, plain)
    assert max(aware) <= slo, aware


def test_with_the_slo_light_load_is_served_as_fast_as_without() -> None:
    cost = CostModel(FIXED, PER, jitter_s=0.003)
    load = arrivals.poisson(0.3 * 2 * 64 / t(64), 20.0, seed=1)
    plain = simulate(cost, Deployment(2), load, seed=1)
    aware = simulate(cost, Deployment(2, slo_s=0.2), load, seed=1)
    assert aware.p50_s <= plain.p50_s * 1.05 and aware.p99_s <= plain.p99_s * 1.05
    assert aware.mean_batch == pytest.approx(plain.mean_batch, rel=0.1)
