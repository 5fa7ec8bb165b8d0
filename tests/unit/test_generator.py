"""The load generator's pure parts: the send schedule and the served rate."""

from __future__ import annotations

import pytest

from loadtest.generator import schedule, served_rate


def test_schedule_is_reproducible_from_its_seed() -> None:
    assert schedule(100, 50, seed=3) == schedule(100, 50, seed=3)
    assert schedule(100, 50, seed=3) != schedule(100, 50, seed=4)


def test_poisson_schedule_has_the_asked_mean_rate() -> None:
    times = schedule(500, 20_000, seed=1)
    assert times[0] == 0.0 and times == sorted(times)
    assert 20_000 / times[-1] == pytest.approx(500, rel=0.03)


def test_constant_schedule_is_evenly_spaced() -> None:
    assert schedule(4, 5, seed=1, poisson=False) == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_a_system_that_keeps_up_served_the_offered_rate() -> None:
    times = schedule(100, 600, seed=2)
    done = [t + 0.3 for t in times]  # every answer 300 ms after its send, whatever the noise
    assert served_rate(100, times, done) == pytest.approx(100, rel=0.05)


def test_a_system_that_falls_behind_served_its_own_rate() -> None:
    times = schedule(400, 4000, seed=2)
    done = [i / 250 for i in range(1, len(times) + 1)]  # answers at 250/s, a growing backlog
    assert served_rate(400, times, done) == pytest.approx(250, rel=0.1)


def test_failures_lower_the_served_rate() -> None:
    times = schedule(100, 1000, seed=5)
    done = [t + 0.01 for i, t in enumerate(times) if i % 2]  # half of them failed
    assert served_rate(100, times, done) == pytest.approx(50, rel=0.1)


def test_a_short_run_uses_the_share_of_successes() -> None:
    times = schedule(10, 10, seed=1)
    assert served_rate(10, times, [t + 0.1 for t in times[:9]]) == pytest.approx(9.0)
    assert served_rate(10, times, []) == 0.0
