"""The planner against the GPU kit's runs (PLANNER.md, "On a GPU"): a run's Ferry measurements
are read by instance count, with each process's CPU per inference, and predicted."""

from __future__ import annotations

from typing import Any

from ferry.planner import validate_gpu


def probe(model: str, rate: float, p99_ms: float, errors: list[str] | None = None,
          system: str = "ferry") -> dict[str, Any]:
    return {"system": system, "model": model, "rate": rate, "inferences": 1000,
            "mean_batch": 4.0, "cpu_s": {"gateway": 0.5, "batchers": 0.2, "redis": 0.1,
                                         "ferry": 0.8},
            "measured": {"throughput": rate * 0.99, "p50_ms": p99_ms / 2, "p99_ms": p99_ms,
                         "errors": errors or []}}


RUN = {"started": "2026-11-27T07:16:24+00:00", "machine": {"cards": ["GPU 0: H200 (UUID: x)"]},
       "sizing": {"gateways": 2, "batchers": 1}, "fit": {"t_fixed_ms": 2.0, "t_per_ms": 0.2},
       "probes": [probe("resnet50", 200, 12.0), probe("resnet50_triton", 200, 5.0,
                                                      system="triton"),
                  probe("resnet50_x2", 100, 11.0), probe("resnet50", 400, 0, ["CANCELLED"])],
       "warm_up": [probe("resnet50", 100, 10.0)]}


def test_the_runs_ferry_measurements_that_completed_by_instance_count() -> None:
    found = validate_gpu.points(RUN)
    assert {n: [p.offered for p in group] for n, group in found.items()} == {
        1: [100, 200], 2: [100]}
    cpu = found[1][0].cpu
    assert cpu is not None and cpu.batch == 4.0
    assert cpu.seconds == {"gateway": 0.0005, "batcher": 0.0002, "redis": 0.0001}


def test_each_rate_is_predicted_and_counted_against_the_goal() -> None:
    lines, within, counted = validate_gpu.run_section(RUN, "run.json")
    assert counted == 3 and 0 <= within <= counted
    assert lines[1].startswith("### GPU 0: H200, 2026-11-27 07:16 UTC (run.json): t(B) = 2.00")
    rows = [line for line in lines if line.startswith("| 1") or line.startswith("| 2")]
    assert len(rows) == 3
    assert validate_gpu.section([]) == []
