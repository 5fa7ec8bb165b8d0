"""The circuit breaker: pure, on a clock the test supplies."""

from __future__ import annotations

import pytest

from ferry.rules.breaker import BreakerState, CircuitBreaker


def breaker() -> CircuitBreaker:
    return CircuitBreaker(threshold=0.5, window_s=10.0, min_calls=4, cooldown_s=30.0)


def feed(b: CircuitBreaker, outcomes: str, at: float = 0.0) -> None:
    for i, mark in enumerate(outcomes):
        assert b.allow(at + i * 0.01)
        b.record(at + i * 0.01, ok=mark == "+")


def test_opens_when_the_error_rate_passes_the_threshold_with_enough_calls() -> None:
    b = breaker()
    feed(b, "+--")  # 67% failed, but only 3 calls
    assert b.state(1.0) is BreakerState.CLOSED
    feed(b, "+", at=1.0)  # 4 calls, 2 failed: 50%
    assert b.state(1.1) is BreakerState.OPEN
    assert not b.allow(1.1)
    assert b.retry_after(1.1) == pytest.approx(29.9)


def test_stays_closed_below_the_threshold() -> None:
    b = breaker()
    feed(b, "+++-++-+")
    assert b.state(1.0) is BreakerState.CLOSED
    assert b.error_rate(1.0) == 0.25


def test_old_calls_leave_the_window() -> None:
    b = breaker()
    feed(b, "---", at=0.0)
    feed(b, "+", at=11.0)  # the failures are more than 10 s old
    assert b.state(11.1) is BreakerState.CLOSED
    assert b.error_rate(11.1) == 0.0


def test_half_opens_after_the_cooldown_with_one_probe_that_closes_it() -> None:
    b = breaker()
    feed(b, "----")
    assert b.state(29.0) is BreakerState.OPEN
    assert b.state(30.1) is BreakerState.HALF_OPEN
    assert b.allow(30.1)  # the probe
    assert not b.allow(30.2)  # one at a time
    b.record(30.3, ok=True)
    assert b.state(30.3) is BreakerState.CLOSED
    assert b.error_rate(30.3) == 0.0  # the old failures are forgotten


def test_a_failed_probe_opens_it_for_another_cooldown() -> None:
    b = breaker()
    feed(b, "----")
    assert b.allow(31.0)
    b.record(31.0, ok=False)
    assert b.state(31.0) is BreakerState.OPEN
    assert b.state(60.0) is BreakerState.OPEN
    assert b.state(61.1) is BreakerState.HALF_OPEN


def test_an_abandoned_probe_lets_the_next_call_probe() -> None:
    b = breaker()
    feed(b, "----")
    assert b.allow(31.0)
    b.abandon()  # e.g. Triton was unreachable: that says nothing of the model
    assert b.allow(31.1)


def test_gauge_values() -> None:
    assert [s.gauge for s in BreakerState] == [0, 2, 1]
