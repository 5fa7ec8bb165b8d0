"""What the adaptive flush learns: arrival rates and a model's cost per call."""

from __future__ import annotations

import math

import pytest

from ferry.batching.estimators import ArrivalRate, BatchCost


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
