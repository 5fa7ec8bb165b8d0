"""What the adaptive flush learns: arrival rates and a model's cost per call."""

from __future__ import annotations

import math
import random

import pytest

from ferry.rules.estimators import ArrivalRate, BatchCost, Window, service_rate


def test_no_arrivals_means_rate_zero() -> None:
    assert ArrivalRate().at(100.0) == 0.0


def test_steady_arrivals_converge_to_their_rate() -> None:
    rate = ArrivalRate(tau_s=0.5)
    for i in range(2000):  # 200/s for 10 s
        rate.add(i * 0.005)
    assert rate.at(1999 * 0.005) == pytest.approx(200.0, rel=0.02)


def test_arrivals_counted_in_bulk_give_the_same_rate() -> None:
    one_by_one, in_bulk = ArrivalRate(tau_s=0.5), ArrivalRate(tau_s=0.5)
    for i in range(1000):
        one_by_one.add(i * 0.005)
    for i in range(0, 1000, 10):  # read ten at a time, as a batcher reading a stream does
        in_bulk.add(i * 0.005 + 0.045, count=10)
    assert in_bulk.at(5.0) == pytest.approx(one_by_one.at(5.0), rel=0.1)


def test_rate_decays_when_nobody_comes() -> None:
    rate = ArrivalRate(tau_s=0.5)
    for i in range(1000):
        rate.add(i * 0.01)
    busy = rate.at(9.99)
    assert rate.at(9.99 + 0.5) == pytest.approx(busy / math.e)
    assert rate.at(9.99 + 5.0) < busy / 1000


def test_reading_does_not_change_the_rate() -> None:
    rate = ArrivalRate()
    rate.add(1.0, count=5)
    assert rate.at(1.2) == rate.at(1.2)
    assert rate.at(1.0) == pytest.approx(5 / rate.tau_s)


def test_unknown_cost_is_zero() -> None:
    cost = BatchCost()
    assert not cost.known
    assert (cost.fixed_s, cost.per_item_s, cost.mean_s) == (0.0, 0.0, 0.0)


def test_fits_fixed_and_per_item_cost() -> None:
    cost = BatchCost(weight=0.05)
    for i in range(400):
        batch = 1 + i % 64
        cost.add(batch, 0.004 + 0.00025 * batch)
    assert cost.fixed_s == pytest.approx(0.004, rel=1e-6)
    assert cost.per_item_s == pytest.approx(0.00025, rel=1e-6)


def test_with_one_batch_size_all_of_the_cost_counts_as_fixed() -> None:
    cost = BatchCost()
    for _ in range(50):
        cost.add(1, 0.006)
    assert cost.per_item_s == 0.0
    assert cost.fixed_s == pytest.approx(0.006)


def test_the_fit_follows_a_change_in_the_model() -> None:
    cost = BatchCost(weight=0.1)
    for i in range(200):
        cost.add(1 + i % 8, 0.050 + 0.002 * (1 + i % 8))
    for i in range(200):  # a faster model version is loaded
        cost.add(1 + i % 8, 0.004 + 0.00025 * (1 + i % 8))
    assert cost.fixed_s == pytest.approx(0.004, abs=0.001)


def test_fixed_cost_is_never_negative_nor_above_the_mean() -> None:
    cost = BatchCost()
    for batch, seconds in ((1, 0.001), (2, 0.010), (3, 0.030), (4, 0.050)):  # steep: intercept < 0
        cost.add(batch, seconds)
    assert 0.0 <= cost.fixed_s <= cost.mean_s


# --- service rate ---------------------------------------------------------------------------------


def fitted(sizes: list[int], fixed_s: float, per_item_s: float) -> BatchCost:
    cost = BatchCost()
    for size in sizes:
        cost.add(size, fixed_s + per_item_s * size)
    return cost


def test_service_rate_at_full_batches_from_the_fitted_cost() -> None:
    cost = fitted([1, 8, 3, 16, 2, 30] * 20, fixed_s=0.050, per_item_s=0.002)
    # 2 slots of 64 in t(64) = 0.178 s
    assert service_rate(cost, slots=2, batch=64) == pytest.approx(2 * 64 / 0.178, rel=0.01)


def test_service_rate_with_one_batch_size_is_what_that_size_gives() -> None:
    cost = fitted([8] * 30, fixed_s=0.050, per_item_s=0.002)
    assert service_rate(cost, slots=1, batch=8) == pytest.approx(8 / 0.066, rel=0.01)


def test_no_calls_no_rate() -> None:
    assert service_rate(BatchCost(), slots=4, batch=64) == 0.0


# --- the in-flight window (AIMD) ------------------------------------------------------------------


def test_window_starts_open_and_halves_on_a_slow_call() -> None:
    window = Window(limit=4)
    assert window.allowed == 4
    window.observe(seconds=0.100, expected_s=0.040)  # 2.5x the fit: Triton is queueing it
    assert window.allowed == 2
    window.observe(seconds=0.100, expected_s=0.040)
    window.observe(seconds=0.100, expected_s=0.040)
    assert window.allowed == 1  # never below one


def test_window_grows_back_by_one_per_window_of_calls_on_time() -> None:
    window = Window(limit=4)
    window.overloaded()
    window.overloaded()
    assert window.allowed == 1
    window.observe(0.040, 0.040)
    assert window.allowed == 2
    for _ in range(3):  # about one window's worth of calls (2 + 1/2 + 1/2.5 + 1/2.9)
        window.observe(0.040, 0.040)
    assert window.allowed == 3
    for _ in range(10):
        window.observe(0.040, 0.040)
    assert window.allowed == 4  # never above the instances


def test_window_ignores_timer_noise_on_tiny_calls_and_calls_without_a_fit() -> None:
    window = Window(limit=2)
    window.observe(seconds=0.003, expected_s=0.001)  # 3x, but only 2 ms longer
    window.observe(seconds=10.0, expected_s=0.0)  # nothing to compare with yet
    assert window.allowed == 2


def test_window_follows_the_instance_count() -> None:
    window = Window(limit=1)
    window.resize(3)
    assert window.allowed == 3  # it was open all the way: it stays so
    window.overloaded()
    window.resize(4)
    assert window.allowed == 1  # a halved window is not reopened by a resize
    window.resize(1)
    assert window.allowed == 1


def test_batch_cost_tracks_how_late_nine_calls_in_ten_end() -> None:
    """Calls 0-10 ms past a steady t(B): the fit takes in their mean, so they run -5 to +5 ms
    past it, and late_s settles near the 90th percentile of that, 4 ms."""
    cost = BatchCost()
    rng = random.Random(3)
    for i in range(3000):
        batch = 1 + i % 64
        cost.add(batch, 0.050 + 0.002 * batch + (rng.uniform(0.0, 0.010) if i >= 200 else 0.0))
    assert cost.late_s == pytest.approx(0.004, abs=0.0015)
    fresh = BatchCost()
    fresh.add(8, 0.5)
    assert fresh.late_s == 0.0  # not before the fit has settled
