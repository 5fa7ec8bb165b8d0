"""How the sizing search saves runs without changing its answer: grid points that cannot win
are not simulated, a run that cannot meet its bound stops early with the verdict the whole run
gives, and the progress it reports counts the runs it makes."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from dataclasses import replace
from typing import Any

import pytest

from ferry.cli import main
from ferry.errors import ConfigError
from ferry.planner import arrivals
from ferry.planner import search as search_module
from ferry.planner.costs import CostModel
from ferry.planner.cpu import BENCH_CPU, CpuCost
from ferry.planner.deployment import Bound, Deployment, Outcome
from ferry.planner.progress import ProgressLine, progress_text
from ferry.planner.search import Progress, Target, size
from ferry.planner.simulate import simulate

DESIGN_COST = CostModel(0.040, 0.0025)  # docs/cli.md's design scenario: 200 ms at 64


def test_the_design_scenario_at_a_tenth_of_its_load() -> None:
    """docs/cli.md's scenario (p99 < 500 ms, t(B) = 40 + 2.5·B ms, Ferry's CPU) at 1,000/s:
    the answer the exhaustive search gave (71 runs) from 6 runs, as max batch 16 and 32 need
    more instances at full batches (6 and 5) than 64 meets the target with (4), the points told
    the SLO would run as those without it, and the answer holds on the headroom's runs (the
    search's and two more) at once. (The design scenario itself: test_planner_docs.py.)"""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["plan", "size", "--qps", "1000", "--p99-ms", "500", "--t-fixed-ms", "40",
                     "--t-per-ms", "2.5", "--json"]) == 0
    plan = json.loads(out.getvalue())
    assert plan["deployment"] == {
        "gpu_instances": 4, "triton_replicas": 4, "instances_per_replica": 1,
        "inflight_budget": 4, "batchers": 1, "budget_riders": True, "partitions": 16,
        "gateways": 2, "redis_shards": 1,
        "max_batch": 64, "max_wait_ms": 10.0, "overhead_ms": 1.5, "max_backlog": 12800}
    assert plan["headroom"]["p99_ms"] == pytest.approx([394.261, 355.769, 368.082], abs=0.001)
    assert plan["at_design_load"]["p99_ms"] == max(plan["headroom"]["p99_ms"])
    assert plan["headroom"]["p99_bound_ms"] == pytest.approx(438.984, abs=0.001)
    assert plan["envelope"]["gpu_instances"] == 4
    assert plan["simulated_configurations"] == 6


def test_grid_points_whose_bound_is_above_the_best_are_never_simulated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    simulated: list[Deployment] = []

    def recording(cost: CostModel, deployment: Deployment, load: Sequence[float], seed: int = 0,
                  warmup_s: float | None = None, *, bound: Bound | None = None,
                  shadow_slo_s: float = 0.0) -> Outcome:
        simulated.append(deployment)
        return simulate(cost, deployment, load, seed, warmup_s, bound=bound,
                        shadow_slo_s=shadow_slo_s)

    monkeypatch.setattr(search_module, "simulate", recording)
    target = Target(qps=1000, p99_s=0.5, cpu=BENCH_CPU, overhead_s=0.0015, search_seconds=10,
                    check_seconds=10)
    sizing = size(DESIGN_COST, target, arrivals.poisson)
    assert sizing.deployment.instances == 4 and sizing.candidates == len(simulated)
    assert {d.max_batch for d in simulated[:-1]} == {64}  # the last: the envelope's
    assert max(d.instances for d in simulated) == 4


def test_the_shortcuts_at_the_fewest_instances_change_no_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At the fewest instances found, a point's run stops once its p99 is past the best's, and
    a point told the SLO is not run where the same point without it showed the SLO changes
    nothing: the same answer, on the same runs, from fewer of them."""
    target = Target(qps=1000, p99_s=0.5, cpu=BENCH_CPU, overhead_s=0.0015, search_seconds=10,
                    check_seconds=10)
    quick = size(DESIGN_COST, target, arrivals.poisson)
    fewest = search_module._fewest

    def without_beat(*args: Any, **kwargs: Any) -> tuple[Deployment, Outcome] | None:
        return fewest(*args, **{**kwargs, "beat": None})

    monkeypatch.setattr(search_module, "_fewest", without_beat)
    monkeypatch.setattr(search_module._Runs, "_same_run", lambda *_: None)
    every = size(DESIGN_COST, target, arrivals.poisson)
    assert quick.deployment == every.deployment
    assert quick.design_p99s == every.design_p99s and quick.at_target == every.at_target
    assert quick.candidates < every.candidates


@pytest.mark.parametrize("instances", [3, 4, 5])
def test_a_bounded_run_gives_the_whole_runs_verdict_and_stops_when_it_fails(
        instances: int) -> None:
    """Around the answer of the test above: below it the bounded run stops early, past 1% of
    its tasks late; where it meets the target it is the whole run, figure for figure."""
    target = Target(qps=1000, p99_s=0.5, cpu=BENCH_CPU, overhead_s=0.0015)
    deployment = search_module._with_instances(
        Deployment(instances=1, cpu=BENCH_CPU, overhead_s=0.0015), instances, DESIGN_COST,
        target)
    load = arrivals.poisson(target.design_qps, 10, seed=0)
    whole = simulate(DESIGN_COST, deployment, load)
    bounded = simulate(DESIGN_COST, deployment, load, bound=target.bound)
    assert search_module._meets(bounded, target) == search_module._meets(whole, target)
    if search_module._meets(whole, target):
        assert bounded == whole
    else:
        assert bounded.stopped and bounded.served < whole.served


def test_a_run_whose_batcher_falls_behind_stops_before_any_late_answer() -> None:
    """A batcher that needs 1 ms to read a task, at 1,500/s: it reads each later than the last,
    so 1% of the tasks read past the p99 prove it, before one of them is answered (the whole
    run's p99 is over a minute)."""
    slow = Deployment(instances=8, cpu=CpuCost(batcher_task_s=3e-3), overhead_s=0.0015)
    load = arrivals.poisson(1500, 20, seed=1)
    whole = simulate(CostModel(0.010, 0.0005), slow, load)
    bounded = simulate(CostModel(0.010, 0.0005), slow, load, bound=Bound(p99_s=0.5))
    assert whole.p99_s > 60
    assert bounded.stopped and bounded.served == 0


def test_a_run_stops_once_admission_has_refused_more_than_its_bound_allows() -> None:
    cost = CostModel(0.050, 0.002)  # 8 per batch: 121 tasks/s
    times = arrivals.poisson(240, 30, seed=2)
    tight = Deployment(instances=1, max_batch=8, max_backlog=240)
    whole = simulate(cost, tight, times, warmup_s=0.0)
    bounded = simulate(cost, tight, times, warmup_s=0.0, bound=Bound(refused=0.001))
    assert whole.refused > 0.001 * whole.offered
    assert bounded.stopped and bounded.refused == int(0.001 * len(times)) + 1


def needing(search: int, check: int) -> Callable[..., Outcome]:
    """A stand-in simulation: the target's p99 (0.5 s) holds from ``search`` instances on the
    search's arrivals (seed 0), from ``check`` on the headroom's others (seeds 1 and 2)."""

    def run(cost: CostModel, deployment: Deployment, load: Sequence[float], seed: int = 0,
            warmup_s: float | None = None, *, bound: Bound | None = None,
            shadow_slo_s: float = 0.0) -> Outcome:
        holds = deployment.instances >= (search if seed in (0, 3) else check)
        return Outcome(offered=100, served=100, refused=0, seconds=10.0, p50_s=0.1, p90_s=0.2,
                       p99_s=0.4 if holds else 0.6, p999_s=0.7, mean_s=0.1, utilisation=0.9,
                       mean_batch=32.0)

    return run


@pytest.mark.parametrize(("check", "answer", "check_runs"),
                         [(6, 6, 2), (13, 13, 12), (10**6, None, 17)])
def test_a_failed_check_grows_the_answer_to_the_first_growth_that_holds(
        monkeypatch: pytest.MonkeyPatch, check: int, answer: int | None,
        check_runs: int) -> None:
    """The search finds 6 instances (the capacity bound at 1,800/s); the headroom's runs on
    other arrivals need ``check``: the answer is the first of 6, 7, 8... (5% steps, at least
    one) that holds them all, found in a handful of counts (6 takes the two runs besides the
    search's; a count that fails stops at its first run that does); where none up to 4,096
    does, nine counts say so, not the hundred and thirty-five a step at a time would take."""
    monkeypatch.setattr(search_module, "simulate", needing(6, check))
    told: list[Progress] = []
    target = Target(qps=1500, p99_s=0.5)
    if answer is None:
        with pytest.raises(ConfigError, match="no deployment of up to 4096"):
            size(DESIGN_COST, target, arrivals.poisson, told.append)
    else:
        assert size(DESIGN_COST, target, arrivals.poisson,
                    told.append).deployment.instances == answer
    assert len([p for p in told if p.stage == "checking"]) == check_runs
    assert len([p for p in told if p.stage == "figures"]) == (2 if answer else 0)  # the
    # answer's and the envelope's at the target load
    assert search_module._growths(6, 4096)[:16] == [*range(6, 21), 21]
    assert len(search_module._growths(6, 4096)) == 135


def test_progress_counts_every_run_and_ends_with_the_answers_figures() -> None:
    told: list[Progress] = []
    target = Target(qps=1000, p99_s=0.5, search_seconds=5, check_seconds=5)
    sizing = size(DESIGN_COST, target, arrivals.poisson, told.append)
    assert [p.run for p in told] == list(range(1, sizing.candidates + 1))
    assert told[0].best is None and told[0].stage == "searching"
    assert [p.stage for p in told[-2:]] == ["figures"] * 2
    assert told[-1].best == sizing.deployment
    assert told[-1].expected == sizing.candidates


def test_the_progress_line_says_where_the_sizing_is() -> None:
    best = Deployment(instances=38, max_batch=64, max_wait_s=0.05)
    assert progress_text(Progress(2, 7, best, "searching"), 2.4) == (
        "searching: 2 of ~7 runs, best so far 38 instances (64 / 50 ms), 2 s")
    assert progress_text(Progress(1, 13, None, "searching"), 0.1) == (
        "searching: 1 of ~13 runs, none meets the target yet, 0 s")
    assert progress_text(Progress(5, 7, replace(best, slo_s=0.4985), "checking"), 7) == (
        "checking: 5 of ~7 runs, 38 instances at the design load on other arrivals, 7 s")
    assert progress_text(Progress(9, 9, best, "figures"), 12) == (
        "figures: 9 of ~9 runs, 38 instances and the envelope's at the target load, 12 s")


def test_off_a_terminal_progress_is_a_line_each_time_the_sizing_moves_on() -> None:
    """A pipe or a CI log gets a line when the stage or its deployment changes, and one at the
    end; not a line a run, and nothing on stdout."""
    best = Deployment(instances=38, max_batch=64, max_wait_s=0.01)
    grown = replace(best, instances=40)
    told = [Progress(1, 9, None, "searching"), Progress(2, 9, best, "searching"),
            Progress(3, 9, best, "searching"), Progress(4, 9, best, "checking"),
            Progress(5, 9, best, "checking"), Progress(6, 9, grown, "checking"),
            Progress(7, 9, grown, "checking"), Progress(8, 9, grown, "figures"),
            Progress(9, 9, grown, "figures")]
    piped = io.StringIO()  # not a terminal
    with redirect_stdout(io.StringIO()) as out, ProgressLine(piped) as line:
        for progress in told:
            line(progress)
    lines = piped.getvalue().splitlines()
    assert [text.split(":")[0] for text in lines] == [
        "searching", "searching", "checking", "checking", "figures", "done"]
    assert lines[1].startswith("searching: 2 of ~9 runs, best so far 38 instances")
    assert lines[3].startswith("checking: 6 of ~9 runs, 40 instances")
    assert lines[-1].startswith("done: 9 runs, ")
    assert out.getvalue() == ""
