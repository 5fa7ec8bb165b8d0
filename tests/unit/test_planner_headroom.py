"""What "sized for +20%" promises (``ferry.planner.headroom``): the p99 one more run at the design
load stays under 19 times in 20, from several runs' p99s; a run of the headroom stops once its
p99 is past what the promise allows. And what spares the search runs without changing its answer:
a run without the SLO tells whether the run told it would be the same."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from ferry.errors import ConfigError
from ferry.planner import arrivals
from ferry.planner.costs import CostModel
from ferry.planner.cpu import EARLIER_CPU
from ferry.planner.deployment import Deployment
from ferry.planner.headroom import MAX_RUNS, largest_next, p99_bound
from ferry.planner.simulate import simulate

TARGET_S = 0.5


def test_the_promise_is_the_mean_plus_students_t_spreads() -> None:
    p99s = [0.1, 0.2, 0.3]  # mean 0.2, sd 0.1; t(2 degrees of freedom, 95%) = 2.920
    assert p99_bound(p99s) == pytest.approx(0.2 + 2.920 * 0.1 * math.sqrt(4 / 3))
    assert p99_bound([0.3, 0.3, 0.3]) == pytest.approx(0.3)


def test_runs_that_agree_promise_about_their_worst_and_runs_that_disagree_far_more() -> None:
    """The design scenario's runs of 20 s at 12,000/s: 42 instances agree (285, 288, 290 ms);
    38 met the target on each of three runs (376, 377, 497 ms), but the spread between them
    promises a p99 far past it."""
    assert p99_bound([0.285, 0.288, 0.290]) == pytest.approx(0.2962, abs=1e-4)
    assert max([0.376, 0.377, 0.497]) < TARGET_S < p99_bound([0.376, 0.377, 0.497])


def test_a_run_may_stop_once_its_p99_is_past_what_the_promise_allows() -> None:
    assert largest_next([], 3, TARGET_S) == TARGET_S  # the first: the target itself
    last = largest_next([0.3757, 0.3769], 3, TARGET_S)
    assert last is not None and p99_bound([0.3757, 0.3769, last]) == pytest.approx(TARGET_S)
    assert 0.4 < last < 0.44  # the third run of 38 instances (497 ms) stops well before
    second = largest_next([0.3757], 3, TARGET_S)  # the third taken at the two's mean
    assert second is not None
    assert p99_bound([0.3757, second, statistics.fmean([0.3757, second])]) == pytest.approx(
        TARGET_S)
    assert largest_next([0.2, 0.49], 3, TARGET_S) is None  # no third run makes them agree


@pytest.mark.parametrize("runs", [1, MAX_RUNS + 1])
def test_the_promise_needs_two_to_ten_runs(runs: int) -> None:
    with pytest.raises(ConfigError, match="2 to 10 runs"):
        p99_bound([0.1] * runs)
    with pytest.raises(ConfigError, match="2 to 10 runs"):
        largest_next([], runs, TARGET_S)


COST = CostModel(0.040, 0.0025)  # docs/cli.md's design scenario: 200 ms at 64


@pytest.mark.parametrize(("wait_s", "slo_s", "changes"), [
    (0.01, 0.4985, False), (0.05, 0.4985, False), (0.05, 0.3, True)])
def test_a_run_tells_whether_the_slo_it_shadows_would_change_it(
        wait_s: float, slo_s: float, changes: bool) -> None:
    """The design scenario's 39 instances at 12,000/s, shared by 4 batchers: told the target's
    SLO (498.5 ms), the batchers decide as they would without it, with either wait, and the run
    told it is the very same run; told 300 ms, the SLO's deadline has a batcher look again
    sooner, which the shadow reports (so the run told it is made)."""
    deployment = Deployment(instances=39, replicas=39, batchers=4, cpu=EARLIER_CPU,
                            overhead_s=0.0015, gateways=7, redis_shards=3, max_backlog=124_800,
                            max_wait_s=wait_s)
    load = arrivals.poisson(12_000, 2, seed=0)
    shadowed = simulate(COST, deployment, load, shadow_slo_s=slo_s)
    told = simulate(COST, replace(deployment, slo_s=slo_s), load)
    assert shadowed.slo_changes is changes
    assert (replace(shadowed, slo_changes=None) == told) is not changes
    assert simulate(COST, deployment, load).slo_changes is None  # no shadow asked
