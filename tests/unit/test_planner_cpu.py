"""The planner's CPU model (``ferry.planner.cpu``) and Ferry's processes as servers in the
simulation: fits, sizing by CPU, saturation by CPU, and the batcher's work between calls."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest

from ferry.cli import main
from ferry.errors import ConfigError
from ferry.planner import arrivals
from ferry.planner.costs import CostModel
from ferry.planner.cpu import BENCH_CPU, CpuCost, CpuSample, fit
from ferry.planner.deployment import Deployment
from ferry.planner.search import Target, size
from ferry.planner.simulate import simulate
from ferry.planner.validate import cpu_of, fast_cpu, measured_rows

FAST = CostModel(0.004, 0.00025)


def samples(costs: dict[str, tuple[float, float]], batches: list[float]) -> list[CpuSample]:
    return [CpuSample(b, {p: task + per_batch / b for p, (task, per_batch) in costs.items()})
            for b in batches]


def test_the_fit_recovers_each_processs_cost_per_task_and_per_batch() -> None:
    truth = {"gateway": (300e-6, 600e-6), "batcher": (80e-6, 1_300e-6),
             "redis": (90e-6, 350e-6)}
    cpu = fit(samples(truth, [1.0, 2.5, 8.0, 24.0, 60.0]))
    for process, (task, per_batch) in truth.items():
        assert getattr(cpu, f"{process}_task_s") == pytest.approx(task)
        assert getattr(cpu, f"{process}_batch_s") == pytest.approx(per_batch)
        assert cpu.per_task(process, 4.0) == pytest.approx(task + per_batch / 4)


def test_the_fit_never_gives_a_negative_cost() -> None:
    rising = [CpuSample(b, {"gateway": 1e-4 * b, "batcher": 5e-4, "redis": 1e-4 + 1e-3 / b})
              for b in (1.0, 4.0, 16.0)]
    cpu = fit(rising)
    assert cpu.gateway_batch_s == 0 and cpu.gateway_task_s == pytest.approx(7e-4)  # the mean
    assert cpu.batcher_task_s == pytest.approx(5e-4) and cpu.batcher_batch_s == 0.0
    steep = [CpuSample(b, {"gateway": 2e-3 / b - 1e-4, "batcher": 1e-4, "redis": 1e-4})
             for b in (1.0, 2.0)]
    assert fit(steep).gateway_task_s == 0 and fit(steep).gateway_batch_s > 0
    with pytest.raises(ConfigError):
        fit([])


def test_cpu_costs_round_trip_through_json_and_refuse_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(BENCH_CPU.to_json()))
    assert CpuCost.load(path) == pytest.approx(BENCH_CPU)
    path.write_text(json.dumps({"gateway_task_us": 1}))
    with pytest.raises(ConfigError, match="not a CPU cost file"):
        CpuCost.load(path)
    with pytest.raises(ConfigError):
        CpuCost(gateway_task_s=-1.0)


def test_processes_are_counted_so_that_none_is_busier_than_planned() -> None:
    cpu = CpuCost(gateway_task_s=300e-6, gateway_batch_s=640e-6)
    # 12,000/s x (300 + 640/32) µs = 3.84 cores of work; at most 60% busy each: 7 processes
    assert cpu.processes("gateway", 12_000, 32) == 7
    assert cpu.processes("redis", 12_000, 32) == 1  # free work still needs one


def test_free_cpu_changes_nothing() -> None:
    load = arrivals.poisson(800, 10.0, seed=3)
    plain = simulate(FAST, Deployment(instances=1), load, seed=3)
    free = simulate(FAST, Deployment(instances=1, cpu=CpuCost(), gateways=2), load, seed=3)
    assert (free.p50_s, free.p99_s, free.mean_batch) == (plain.p50_s, plain.p99_s,
                                                         plain.mean_batch)
    assert free.cpu_busy == {"gateway": 0.0, "batcher": 0.0, "redis": 0.0}


def test_a_deployment_saturates_by_its_batchers_cpu_before_its_gpu() -> None:
    """Triton could serve 3,200/s at full batches; a batcher that spends 1 ms per task cannot
    pass 1,000/s, so at 1,500/s its queue grows all run long while at 500/s it keeps up."""
    heavy = Deployment(instances=1, cpu=CpuCost(batcher_task_s=1e-3), gateways=2)
    calm = simulate(FAST, heavy, arrivals.poisson(500, 10.0, seed=1), seed=1)
    flooded = simulate(FAST, heavy, arrivals.poisson(1_500, 10.0, seed=1), seed=1)
    assert calm.p99_s < 0.05 and calm.cpu_busy["batcher"] == pytest.approx(0.5, abs=0.1)
    assert flooded.p99_s > 1.0 and flooded.cpu_busy["batcher"] > 0.8
    without = simulate(FAST, Deployment(instances=1), arrivals.poisson(1_500, 10.0, seed=1),
                       seed=1)
    assert without.p99_s < 0.05  # the GPU alone keeps up


def test_the_batchers_work_between_calls_leaves_the_gpu_idle_and_batches_larger() -> None:
    """With 1 instance, each call's completion and the next one's send are the batcher's work
    while the GPU waits: the GPU is busy less of the time and each batch carries more."""
    load = arrivals.poisson(1_200, 10.0, seed=2)
    bare = simulate(FAST, Deployment(instances=1), load, seed=2)
    busy = simulate(FAST, Deployment(instances=1, gateways=2,
                                     cpu=CpuCost(batcher_batch_s=3e-3)), load, seed=2)
    assert busy.mean_batch > 1.3 * bare.mean_batch
    assert busy.p50_s > bare.p50_s + 0.002


def test_sizing_by_cpu_counts_gateways_batchers_and_redis_shards() -> None:
    target = Target(qps=3_000, p99_s=0.5, cpu=BENCH_CPU, overhead_s=0.0015,
                    search_seconds=3, check_seconds=5)
    sizing = size(CostModel(0.040, 0.0025), target, arrivals.poisson)
    qps, half = target.design_qps, 32
    assert sizing.gateways == BENCH_CPU.processes("gateway", qps, half) > 1
    assert sizing.deployment.batchers == BENCH_CPU.processes("batcher", qps, half)
    assert sizing.redis_shards == BENCH_CPU.processes("redis", qps, half)
    assert sizing.deployment.cpu == BENCH_CPU and sizing.at_design.p99_s <= 0.5
    assert max(sizing.at_design.cpu_busy.values()) < 0.9


BENCH_ROWS = """## fast backend, t(B) = 4 + 0.25·B ms, 1 instance

| system | offered/s | achieved/s | p50 | p90 | p99 | p99.9 ms | errors | Triton batch | busy | Ferry CPU µs/inf (gw + batcher + Redis) | generator µs |
|---|---|---|---|---|---|---|---|---|---|---|---|
| Ferry, 1 request (Prefer: wait) | 50 | 50 | 8.3 | 12.4 | 16.6 | 48.3 | 0 | 1.0 | 22% | 2,500 (800 + 1,267 + 433) | 465 |
| Ferry, 1 request (Prefer: wait) | 400 | 398 | 12.4 | 16.4 | 19.8 | 21.7 | 0 | 3.2 | 66% | 1,167 (500 + 467 + 200) | 162 |
| Ferry, 1 request (Prefer: wait) | 3,000 | 2,230 | 533.0 | 994.8 | 1199.1 | 1251.3 | 0 | 62.5 | 74% | 531 (357 + 80 + 94) | 98 |
"""  # noqa: E501 - BENCHMARKS.md's own lines


def test_the_cpu_costs_come_from_make_benchs_rows_below_saturation() -> None:
    rows = list(measured_rows(BENCH_ROWS))
    assert [r.batch for r in rows] == [1.0, 3.2, 62.5]
    assert rows[1].cpu is not None and rows[1].cpu.seconds["batcher"] == pytest.approx(467e-6)
    cpu = cpu_of(rows)
    assert cpu is not None and cpu == fast_cpu(BENCH_ROWS)  # the 3,000/s row is saturated
    assert cpu.per_task("batcher", 1.0) == pytest.approx(1_267e-6)
    assert cpu.per_task("batcher", 3.2) == pytest.approx(467e-6)


def test_the_command_sizes_with_bench_cpu_by_default_and_without_on_request(
        tmp_path: Path) -> None:
    args = ["plan", "size", "--qps", "600", "--p99-ms", "200", "--t-fixed-ms", "10",
            "--t-per-ms", "1", "--seconds", "5", "--json"]
    plans = {}
    for name, extra in (("default", []), ("none", ["--no-cpu"])):
        out = io.StringIO()
        with redirect_stdout(out):
            assert main([*args, *extra]) == 0
        plans[name] = json.loads(out.getvalue())
    assert plans["default"]["cpu"] == pytest.approx(BENCH_CPU.to_json())
    assert plans["default"]["at_design_load"]["cpu_busy"]["batcher"] > 0
    assert plans["none"]["cpu"] is None and plans["none"]["at_design_load"]["cpu_busy"] == {}
    assert plans["default"]["deployment"]["overhead_ms"] == pytest.approx(1.5)
    assert plans["none"]["deployment"]["overhead_ms"] == pytest.approx(3.0)
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(replace(BENCH_CPU, batcher_task_s=2e-3).to_json()))
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*args, "--cpu-costs", str(path)]) == 0
    assert json.loads(out.getvalue())["deployment"]["batchers"] > plans["default"][
        "deployment"]["batchers"]


def test_cpu_scale_multiplies_every_cost_and_sizes_more_processes_on_a_dearer_node() -> None:
    args = ["plan", "size", "--qps", "2000", "--p99-ms", "200", "--t-fixed-ms", "10",
            "--t-per-ms", "1", "--seconds", "5", "--json"]
    plans = {}
    for scale in ("1", "3"):
        out = io.StringIO()
        with redirect_stdout(out):
            assert main([*args, "--cpu-scale", scale]) == 0
        plans[scale] = json.loads(out.getvalue())
    assert plans["3"]["cpu"] == pytest.approx(BENCH_CPU.scaled(3).to_json())
    assert plans["3"]["deployment"]["gateways"] > plans["1"]["deployment"][
        "gateways"]
    for refused in (["--cpu-scale", "0"], ["--cpu-scale", "2", "--no-cpu"]):
        err = io.StringIO()
        with redirect_stderr(err):
            assert main([*args, *refused]) == 2
        assert "--cpu-scale" in err.getvalue()
