"""Retry delays: exponential, capped, jittered into [50%, 100%]."""

from __future__ import annotations

import pytest

from ferry.backoff import backoff_delay


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.6), (6, 2.0), (50, 2.0)],
)
def test_exponential_then_capped_at_full_jitter(attempt: int, expected: float) -> None:
    assert backoff_delay(attempt, base_s=0.1, max_s=2.0, jitter=1.0) == pytest.approx(expected)


def test_zero_jitter_halves_the_delay() -> None:
    assert backoff_delay(3, base_s=0.1, max_s=2.0, jitter=0.0) == pytest.approx(0.2)


def test_half_jitter_is_three_quarters() -> None:
    assert backoff_delay(1, base_s=1.0, max_s=10.0, jitter=0.5) == pytest.approx(0.75)


@pytest.mark.parametrize("jitter", [0.0, 0.1, 0.25, 0.5, 0.75, 0.999])
def test_jitter_keeps_delay_between_half_and_full(jitter: float) -> None:
    delay = backoff_delay(2, base_s=1.0, max_s=10.0, jitter=jitter)
    assert 1.0 <= delay < 2.0
    assert delay == pytest.approx(2.0 * (0.5 + 0.5 * jitter))


@pytest.mark.parametrize(("jitter", "expected"), [(-3.0, 0.5), (7.0, 1.0)])
def test_out_of_range_jitter_is_clamped(jitter: float, expected: float) -> None:
    assert backoff_delay(1, base_s=1.0, max_s=10.0, jitter=jitter) == pytest.approx(expected)


def test_cap_below_base_caps_the_first_retry() -> None:
    assert backoff_delay(1, base_s=5.0, max_s=1.0, jitter=1.0) == pytest.approx(1.0)


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempt_below_one_raises(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt counts from 1"):
        backoff_delay(attempt, base_s=0.1, max_s=2.0, jitter=0.5)
