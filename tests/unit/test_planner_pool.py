"""The simulation's shared in-flight budget (``ferry.planner.simulate``): the instances of every
Triton replica are slots the batchers share, first come, first served without riders (a freed
slot goes to the batcher that waited longest; riders: test_planner_fleet.py), and one batcher
runs as it did when it owned the instances; how a count of instances is laid out on replicas
(``ferry.planner.layout``); and what ``ferry plan size`` answers with it."""

from __future__ import annotations

import io
import json
from collections import deque
from contextlib import redirect_stderr, redirect_stdout

import pytest

from ferry.cli import main
from ferry.errors import ConfigError
from ferry.planner import arrivals
from ferry.planner.costs import CostModel
from ferry.planner.cpu import EARLIER_CPU
from ferry.planner.deployment import Deployment
from ferry.planner.fleet import Batcher, Budget, take_riders
from ferry.planner.layout import Layout
from ferry.planner.simulate import Simulation, simulate
from ferry.rules.estimators import Window

COST = CostModel(0.040, 0.0025, jitter_s=0.002)  # 200 ms at 64: 320/s an instance


def test_one_batcher_runs_as_it_did_when_it_owned_the_instances() -> None:
    """The figures the simulation gave before the budget was shared (a batcher with its window
    of the instances, Ferry's CPU, the SLO policy), however the instances are laid out."""
    load = arrivals.poisson(0.85 * COST.throughput(64, 3), 10, seed=5)
    for replicas in (1, 3):
        deployment = Deployment(instances=3, replicas=replicas, cpu=EARLIER_CPU, gateways=2,
                                overhead_s=0.0015, max_wait_s=0.05, slo_s=0.4)
        outcome = simulate(COST, deployment, load, seed=5)
        assert outcome.p50_s == pytest.approx(0.21560910318528936, abs=1e-12)
        assert outcome.p99_s == pytest.approx(0.30245920256797554, abs=1e-12)
        assert outcome.mean_batch == pytest.approx(35.39301310043668, abs=1e-12)
        assert outcome.served == 7271
        assert outcome.flushes == {"adaptive": 115, "wait": 88, "full": 26}


@pytest.mark.parametrize("riders", [False, True])
@pytest.mark.parametrize("share", [0.5, 0.8, 0.95])
def test_two_batchers_sharing_one_instance_form_batches_as_large_as_one_batcher(
        share: float, riders: bool) -> None:
    """First come, first served, the slot goes to the batcher that waited longest, which sends
    all it holds; with riders, the batch carries the other's too: either way the batches are
    those one queue in front of the instance makes, within 10%, at light and heavy load."""
    load = arrivals.poisson(share * COST.throughput(64), 30, seed=1)
    alone = simulate(COST, Deployment(instances=1), load, seed=1)
    shared = simulate(COST, Deployment(instances=1, batchers=2, riders=riders), load, seed=1)
    assert shared.mean_batch == pytest.approx(alone.mean_batch, rel=0.10)
    assert shared.served == alone.served


@pytest.mark.parametrize(("replicas", "each", "batchers"), [(1, 1, 3), (2, 3, 4), (5, 2, 16)])
def test_never_more_batches_at_triton_than_the_replicas_instances(
        replicas: int, each: int, batchers: int) -> None:
    """Past capacity, with more batchers than instances or fewer: the budget is full and never
    exceeded (each batcher alone would send as many as there are instances)."""
    instances = replicas * each
    load = arrivals.poisson(1.5 * COST.throughput(64, instances), 5, seed=2)
    outcome = simulate(COST, Deployment(instances=instances, replicas=replicas,
                                        batchers=batchers), load, seed=2, warmup_s=0.0)
    assert outcome.peak_in_flight == instances
    capped = simulate(COST, Deployment(instances=instances, replicas=replicas,
                                       batchers=batchers, inflight=1), load, seed=2)
    assert capped.peak_in_flight == min(instances, batchers)


def test_a_freed_slot_goes_to_the_batcher_that_waited_longest() -> None:
    """One instance, calls of 100 ms, batches due 10 ms after their first task. Batcher 0's
    batch takes the instance at 10 ms; batchers 1 (due at 30 ms), 2 (50 ms) and 0 again (70 ms)
    wait in that order, and each sends everything it holds when its turn comes: 1 at 110 ms
    with its two tasks, 2 at 210 ms, 0 at 310 ms."""
    cost = CostModel(0.100, 0.0)
    times = [0.0, 0.02, 0.04, 0.05, 0.06]
    run = Simulation(cost, Deployment(instances=1, batchers=3, max_wait_s=0.01,
                                      adaptive=False, riders=False), warmup_s=0.0)
    run._pick_batcher = iter([0, 1, 2, 1, 0]).__next__
    outcome = run.run(times)
    answered = [0.11, 0.21, 0.31, 0.21, 0.41]  # 0.02 and 0.05 leave together
    assert outcome.handovers == 4  # every batch's slot goes back
    assert outcome.mean_batch == 5 / 4
    assert outcome.mean_s == pytest.approx(sum(a - t for a, t in zip(answered, times,
                                                                      strict=True)) / 5)
    assert outcome.p999_s == pytest.approx(0.41 - 0.06)


def test_a_deployment_spreads_its_instances_evenly_over_its_replicas() -> None:
    assert Deployment(instances=6, replicas=3).instances_per_replica == 2
    with pytest.raises(ConfigError, match="do not spread evenly"):
        Deployment(instances=7, replicas=3)
    with pytest.raises(ConfigError, match="at least 1"):
        Deployment(instances=2, replicas=0)


@pytest.mark.parametrize(("layout", "laid_out"), [
    (Layout(), {1: (1, 1), 7: (7, 1), 39: (39, 1)}),  # a replica an instance
    (Layout(most_per_replica=4), {1: (1, 1), 4: (1, 4), 5: (2, 3), 7: (2, 4), 9: (3, 3)}),
    (Layout(most_per_replica=3), {7: (3, 3)}),  # docs/cli.md's examples: 7 with at most 3 a
    (Layout(replicas=3), {7: (3, 3)}),  # replica, and on 3 replicas
    (Layout(per_replica=3), {1: (1, 3), 3: (1, 3), 4: (2, 3), 39: (13, 3)}),
    (Layout(replicas=4), {1: (4, 1), 4: (4, 1), 5: (4, 2), 39: (4, 10)}),
    (Layout(replicas=4, per_replica=2), {1: (4, 2), 8: (4, 2)}),
])
def test_a_layout_holds_a_count_on_the_fewest_replicas_then_the_fewest_instances_each(
        layout: Layout, laid_out: dict[int, tuple[int, int]]) -> None:
    for count, expected in laid_out.items():
        replicas, each = layout.of(count)
        assert (replicas, each) == expected
        assert replicas * each >= count
    totals = [layout.of(count) for count in range(1, 41)]
    assert [r * e for r, e in totals] == sorted(r * e for r, e in totals)  # a search over counts
    # is one over layouts


def test_a_layout_bounds_the_count_only_where_it_fixes_the_replicas() -> None:
    assert Layout().most(4096) == 4096
    assert Layout(replicas=4).most(4096) == 4096
    assert Layout(replicas=4, most_per_replica=3).most(4096) == 12
    assert Layout(replicas=4, per_replica=2).most(4096) == 8
    assert Layout(replicas=4, per_replica=2).describe() == " (on 4 replicas of 2 instances)"
    assert Layout(replicas=4, most_per_replica=2).describe() == (
        " (on 4 replicas of at most 2 instances)")  # docs/cli.md's example
    assert Layout(most_per_replica=3).describe() == " (at most 3 instances a replica)"
    assert Layout().describe() == ""
    with pytest.raises(ConfigError, match="exclude each other"):
        Layout(per_replica=2, most_per_replica=3)


def plan(*extra: str) -> dict[str, object]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert main(["plan", "size", "--qps", "1000", "--p99-ms", "500", "--t-fixed-ms", "40",
                     "--t-per-ms", "2.5", "--seconds", "10", "--json", *extra]) == 0
    deployment = json.loads(out.getvalue())["deployment"]
    assert isinstance(deployment, dict)
    return deployment


def test_the_sizing_answers_replicas_instances_each_and_the_budget() -> None:
    """docs/cli.md's scenario at a tenth of its load needs 4 instances: a replica each by
    default, 2 replicas of 2 where a replica may run 3, and on 3 replicas 2 each, as 4 do not
    spread evenly over 3 (the smallest even layout that holds them: 6)."""
    layouts = {(): (4, 1), ("--max-instances-per-replica", "3"): (2, 2),
               ("--replicas", "3"): (3, 2), ("--instances-per-replica", "3"): (2, 3)}
    for flags, (replicas, each) in layouts.items():
        deployment = plan(*flags)
        assert (deployment["triton_replicas"], deployment["instances_per_replica"]) == (
            replicas, each), flags
        assert deployment["inflight_budget"] == deployment["gpu_instances"] == replicas * each
        assert "inflight_per_batcher" not in deployment


def test_a_layout_that_cannot_hold_the_target_is_refused_with_a_reason() -> None:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(["plan", "size", "--qps", "1000", "--p99-ms", "500", "--t-fixed-ms", "40",
                     "--t-per-ms", "2.5", "--replicas", "2", "--instances-per-replica", "1"])
    assert code == 2
    assert ("no deployment of up to 2 instances (on 2 replicas of 1 instance) meets p99 500 ms "
            "at 1,200/s") in err.getvalue()


def test_a_holders_pull_takes_the_offers_older_than_its_own_and_a_grant_its_room() -> None:
    """As ``budget_ride.lua``: a pull takes, of the oldest ``batch`` over the holder's own and
    the others' offers, the offers, however much it holds; a slot taken fills its room."""
    def fleet() -> tuple[Batcher, Batcher, Budget]:
        holder, waiter = Batcher(0, Window(1)), Batcher(1, Window(1))
        holder.queue, holder.workers = deque([1.5, 2.5, 3.5, 4.5]), deque([0] * 4)
        holder.in_flight = 1  # its batch runs: it offers nothing
        waiter.queue, waiter.workers = deque([1.0, 2.0, 3.0, 5.0]), deque([1] * 4)
        return holder, waiter, Budget(spare=0)

    holder, waiter, budget = fleet()
    assert take_riders(holder, [holder, waiter], budget, 4, pulled=True) == 2
    assert list(holder.queue)[:4] == [1.0, 1.5, 2.0, 2.5]  # its next batch: the oldest four
    assert list(waiter.queue) == [3.0, 5.0]
    holder, waiter, budget = fleet()
    assert take_riders(holder, [holder, waiter], budget, 4) == 0  # a grant: no room left
    assert take_riders(holder, [holder, waiter], budget, 6) == 2  # room for two: the oldest
    assert list(waiter.queue) == [3.0, 5.0]
