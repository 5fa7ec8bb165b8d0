"""The simulation's fleet (``ferry.planner.fleet``): batchers sharing the in-flight budget as
one queue, as Ferry's do with ``FERRY_BUDGET_RIDERS`` (on by default): a slot taken anywhere
takes the others' oldest tasks along as riders, and a slot stays with its batcher while it has
work, its batch taking the others' offers while it runs. ``riders=False`` is first come, first
served (``test_planner_pool.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ferry.cli import build_parser
from ferry.errors import ConfigError
from ferry.planner import arrivals, command
from ferry.planner.costs import CostModel
from ferry.planner.cpu import BENCH_CPU, CpuCost
from ferry.planner.deployment import Deployment, Outcome
from ferry.planner.simulate import Simulation, simulate

COST = CostModel(0.040, 0.0025, jitter_s=0.002)  # 200 ms at 64: 320/s an instance
LOAD = arrivals.poisson(0.78 * COST.throughput(64), 30, seed=3)  # 78% of one instance


@pytest.fixture(scope="module")
def one_instance() -> dict[str, Outcome]:
    """One instance at 78%, on the same arrivals: one batcher owning it, and four batchers
    sharing it with riders and first come, first served."""
    return {"alone": simulate(COST, Deployment(instances=1), LOAD, seed=3),
            "riders": simulate(COST, Deployment(instances=1, batchers=4), LOAD, seed=3),
            "fcfs": simulate(COST, Deployment(instances=1, batchers=4, riders=False), LOAD,
                             seed=3)}


def test_four_batchers_with_riders_form_the_batches_one_queue_would(
        one_instance: dict[str, Outcome]) -> None:
    """With riders, four batchers in front of one instance are one queue: batches at least 0.9
    of those of one batcher owning the instance, and a p99 within 1.2x of its. First come, first
    served, a task waits for its own batcher's turn as well as for a call: the p99 past 1.5x."""
    alone, riders, fcfs = one_instance["alone"], one_instance["riders"], one_instance["fcfs"]
    assert riders.served == fcfs.served == alone.served
    assert riders.mean_batch >= 0.9 * alone.mean_batch
    assert riders.p99_s <= 1.2 * alone.p99_s
    assert riders.riders > riders.served / 2  # most tasks rode another batcher's batch
    assert fcfs.p99_s > 1.5 * alone.p99_s
    assert fcfs.riders == 0


def test_a_slot_stays_with_its_batcher_while_it_has_work(
        one_instance: dict[str, Outcome]) -> None:
    """Under load the batcher holding the instance always has work when its call ends (its own,
    and the others' offers it took while the call ran): the slot never goes back to the budget
    but once, after the last arrival. First come, first served, every batch's slot goes back."""
    riders, fcfs = one_instance["riders"], one_instance["fcfs"]
    assert riders.handovers == 1
    batches = round(fcfs.served / fcfs.mean_batch)
    assert fcfs.handovers >= batches
    assert one_instance["alone"].handovers == 0  # nobody to hand a slot to


def test_the_holder_takes_the_waiters_tasks_while_its_call_runs_and_sends_them_at_once() -> None:
    """One instance, calls of 100 ms, batches due 10 ms after their first task (the timeline of
    test_planner_pool's first come, first served case). Batcher 0's batch takes the instance at
    10 ms; the tasks batchers 1 and 2 offer meanwhile ride its next batch, which leaves on the
    same slot when the call ends at 110 ms, with batcher 0's own: all four answered at 210 ms
    (first come, first served: 210, 310 and 410 ms)."""
    cost = CostModel(0.100, 0.0)
    times = [0.0, 0.02, 0.04, 0.05, 0.06]
    run = Simulation(cost, Deployment(instances=1, batchers=3, max_wait_s=0.01,
                                      adaptive=False), warmup_s=0.0)
    run._pick_batcher = iter([0, 1, 2, 1, 0]).__next__
    outcome = run.run(times)
    answered = [0.11, 0.21, 0.21, 0.21, 0.21]
    assert outcome.mean_batch == 5 / 2
    assert outcome.riders == 3
    assert outcome.handovers == 1  # after the last batch
    assert outcome.mean_s == pytest.approx(sum(a - t for a, t in zip(answered, times,
                                                                      strict=True)) / 5)


def test_a_kept_slots_next_batch_leaves_before_the_last_ones_results_are_written() -> None:
    """Calls of 100 ms, a batcher's 10 ms of CPU to send a batch and 10 ms to settle one (one
    event loop). Batcher 0's first batch leaves at 10 ms (sent at 20); its second task, boarded
    meanwhile, leaves on the same slot when the call ends at 120 ms, before the first batch's
    results are written (Ferry's freed slot makes way first): sent at 130, answered at 240, the
    first at 140. First come, first served, the slot goes back, and the batcher settles, then
    sends: 130 and 250 ms."""
    cost, cpu = CostModel(0.100, 0.0), CpuCost(batcher_batch_s=0.020)
    times = [0.0, 0.05]

    def run(riders: bool) -> list[float]:
        sim = Simulation(cost, Deployment(instances=1, batchers=2, max_wait_s=0.01,
                                          adaptive=False, cpu=cpu, riders=riders), warmup_s=0.0)
        sim._pick_batcher = iter([0, 0]).__next__
        sim.run(times)
        return sorted(latency + arrival for latency, arrival in zip(sim.latencies, times,
                                                                     strict=True))

    assert run(True) == pytest.approx([0.14, 0.24])
    assert run(False) == pytest.approx([0.13, 0.25])


def test_a_slot_taken_takes_the_others_oldest_offers_along() -> None:
    """Two instances, nothing at Triton: batcher 1's task falls due at 10 ms and takes a spare
    slot, and batcher 2's task, offered meanwhile, rides along (first come, first served, it
    takes the other instance alone at 15 ms)."""
    cost = CostModel(0.100, 0.0)
    times = [0.0, 0.005]

    def run(riders: bool) -> Outcome:
        sim = Simulation(cost, Deployment(instances=2, batchers=3, max_wait_s=0.01,
                                          adaptive=False, riders=riders), warmup_s=0.0)
        sim._pick_batcher = iter([1, 2]).__next__
        return sim.run(times)

    riding, alone = run(True), run(False)
    assert (riding.mean_batch, riding.riders, riding.peak_in_flight) == (2, 1, 1)
    assert riding.mean_s == pytest.approx((0.11 - 0.0 + 0.11 - 0.005) / 2)
    assert (alone.mean_batch, alone.riders, alone.peak_in_flight) == (1, 0, 2)
    assert alone.mean_s == pytest.approx(0.1 + 0.01)


def test_a_slot_given_back_goes_to_the_longest_waiter_with_the_others_offers() -> None:
    """One instance, calls of 97.5 ms, batches due 1 ms after their first task. Batcher 0's call
    ends at 98.5 ms with nothing boarded: batchers 1 and 2 fell due after its last look at the
    offers (96 ms), and wait in line. The slot goes back (a hand-over) to batcher 1, the
    longest waiter, whose batch takes batcher 2's task along."""
    cost = CostModel(0.0975, 0.0)
    times = [0.0, 0.097, 0.0972]
    run = Simulation(cost, Deployment(instances=1, batchers=3, max_wait_s=0.001,
                                      adaptive=False), warmup_s=0.0)
    run._pick_batcher = iter([0, 1, 2]).__next__
    outcome = run.run(times)
    assert (outcome.mean_batch, outcome.riders, outcome.handovers) == (1.5, 1, 2)
    assert outcome.p999_s == pytest.approx(0.0985 + 0.0975 - 0.097)


def test_one_batcher_runs_alike_with_riders_on_and_off() -> None:
    """Riders need a fleet: one batcher (Ferry's local budget), or batchers each with its own
    window of the instances (FERRY_INFLIGHT_BUDGET=local), run as they did without them."""
    load = arrivals.poisson(0.85 * COST.throughput(64, 3), 10, seed=5)
    alone = Deployment(instances=3, cpu=BENCH_CPU, gateways=2, overhead_s=0.0015, slo_s=0.4)
    local = Deployment(instances=3, batchers=3, shared_budget=False)
    for deployment in (alone, local):
        on = simulate(COST, deployment, load, seed=5)
        assert simulate(COST, replace(deployment, riders=False), load, seed=5) == on
        assert on.riders == on.handovers == 0
    assert alone.fleet == local.fleet == 1
    assert Deployment(instances=3, batchers=3).fleet == 3
    assert Deployment(instances=3, batchers=3, riders=False).fleet == 1


def test_riders_are_deterministic_under_a_seed() -> None:
    deployment = Deployment(instances=2, batchers=3, cpu=BENCH_CPU, gateways=2)
    load = arrivals.poisson(0.8 * COST.throughput(64, 2), 10, seed=9)
    assert simulate(COST, deployment, load, seed=9) == simulate(COST, deployment, load, seed=9)


def test_batches_per_instance_widen_the_budget_and_queue_at_triton() -> None:
    """FERRY_BATCHES_PER_INSTANCE=2: two batches of the budget per instance, one running and
    one waiting at Triton."""
    deployment = Deployment(instances=2, batchers=3, batches_per_instance=2)
    assert (deployment.slots, deployment.window) == (4, 4)
    load = arrivals.poisson(1.5 * COST.throughput(64, 2), 5, seed=2)
    assert simulate(COST, deployment, load, seed=2, warmup_s=0.0).peak_in_flight == 4
    with pytest.raises(ConfigError, match="batches per instance"):
        Deployment(instances=2, batches_per_instance=0)


def test_the_sizing_takes_first_come_first_served_on_request() -> None:
    """``ferry plan size --no-riders`` sizes for FERRY_BUDGET_RIDERS=false, and says so."""
    size = ["plan", "size", "--qps", "100", "--p99-ms", "500", "--t-fixed-ms", "40",
            "--t-per-ms", "2.5"]
    for flags, riders in (([], True), (["--no-riders"], False)):
        argv = [*size, *flags]
        assert command.target_of(build_parser(argv).parse_args(argv)).riders is riders
    assert command._sharing(Deployment(instances=2, batchers=2, riders=False)).endswith(
        ", first come, first served (FERRY_BUDGET_RIDERS=false)")
    assert "RIDERS" not in command._sharing(Deployment(instances=2, batchers=2))
    assert command._sharing(Deployment(instances=2)) == ""
