"""The client's retry policy: exponential backoff with full jitter, Retry-After as a floor,
bounded by attempts and a deadline; what is retried."""

from __future__ import annotations

import pytest

from ferry.client.retrying import Attempts, RetryPolicy, retried_status, retry_after_s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_backoff_doubles_up_to_its_ceiling_and_is_jittered_below_it() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0)
    assert [policy.delay(n, None, lambda: 0.999999) for n in range(6)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0], rel=1e-5)
    assert policy.delay(3, None, lambda: 0.0) == 0.0
    assert policy.delay(3, None, lambda: 0.5) == pytest.approx(0.4)


def test_retry_after_is_a_floor_with_a_little_jitter_above() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0)
    assert policy.delay(0, 2.0, lambda: 0.0) == 2.0
    assert 2.0 <= policy.delay(5, 2.0, lambda: 0.99) <= 2.1


def test_attempts_stop_at_the_count() -> None:
    clock = Clock()
    attempts = Attempts(RetryPolicy(attempts=3), clock=clock, draw=lambda: 0.5)
    assert attempts.next_delay() is not None
    assert attempts.next_delay() is not None
    assert attempts.next_delay() is None  # three tries made


def test_a_wait_past_the_deadline_is_not_waited() -> None:
    clock = Clock()
    attempts = Attempts(RetryPolicy(attempts=100, deadline_s=5), clock=clock, draw=lambda: 0.5)
    assert attempts.next_delay(retry_after=3) == pytest.approx(3.005)
    clock.now += 3
    assert attempts.next_delay(retry_after=3) is None  # would end at 6 s > 5 s
    assert attempts.next_delay(retry_after=1) is not None


def test_a_policy_that_cannot_work_is_refused() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="max_delay_s"):
        RetryPolicy(base_delay_s=2, max_delay_s=1)


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    assert retry_after_s("3") == 3.0
    assert retry_after_s("0.5") == 0.5
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:05 GMT", now=1445412480.0) == 5.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:05 GMT", now=1445412490.0) == 0.0


def test_only_429_and_503_are_retried() -> None:
    assert retried_status(429) and retried_status(503)
    assert not any(retried_status(s) for s in (200, 202, 400, 404, 409, 422, 500, 502))
