"""The goodput targets' table of BENCHMARKS.md (``loadtest.bench.goals``), from raw results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadtest.bench import goals
from loadtest.bench.goodput import HEADING as GOODPUT_HEADING


def goodput(scenario: str, system: str, protocol: str, rate: float, *, ceiling: float = 719,
            slo: float = 406.0, variant: str = "") -> dict[str, Any]:
    return {"scenario": scenario, "system": system, "protocol": protocol, "slo_ms": slo,
            "ceiling": ceiling, "rate": rate, "variant": variant}


def point(scenario: str, system: str, rate: float, p99: float, busy: float,
          cpu: float = 0.0) -> dict[str, Any]:
    return {"scenario": scenario, "system": system, "offered_rps": rate, "busy_fraction": busy,
            "run": {"p99_ms": p99}, "cpu_us": {"gateway": cpu / 2, "batcher": cpu / 4,
                                               "redis": cpu / 4, "triton": 999.0}}


def test_goodput_is_ferrys_over_triton_alones_on_grpc_and_even_when_both_reach_capacity(
) -> None:
    found = goals.goodput_goals([
        goodput("slow_2i", "ferry", "grpc", 719), goodput("slow_2i", "triton", "grpc", 719),
        goodput("slow_2i", "ferry", "http", 400), goodput("slow_2i", "triton", "http", 500),
        goodput("fast_1i", "ferry", "grpc", 800, ceiling=3200, slo=50),
        goodput("fast_1i", "triton", "grpc", 1900, ceiling=3200, slo=50)])
    by_name = {g.target: g for g in found}
    slow, fast = by_name["Goodput at the SLO, slow 2i"], by_name["Goodput at the SLO, fast 1i"]
    assert slow.met is True and "≥ 719/s vs ≥ 719/s (1.00)" in slow.measured
    assert "http: 400/s vs 500/s (0.80)" in slow.measured  # shown, not judged
    assert fast.met is False and "(0.42)" in fast.measured and "p99 ≤ 50 ms" in fast.goal


def test_told_the_slo_is_compared_with_triton_at_the_same_slo() -> None:
    found = goals.told_goals([
        goodput("slow_2i", "ferry-slo", "grpc", 400, slo=200, variant="slo"),
        goodput("slow_2i", "triton", "grpc", 360, slo=200, variant="slo"),
        goodput("slow_2i", "triton", "grpc", 719, slo=406)])
    assert [(g.met, g.measured) for g in found] == [(True, "400/s vs 360/s (1.11)")]


def test_the_slow_backend_at_80_percent_needs_the_p99_and_the_busy_share() -> None:
    points = [point("slow_2i", "ferry-2req", 575, 330, 0.95),
              point("slow_2i", "triton-dyn0", 575, 300, 0.96),
              point("slow_2i", "ferry-2req", 100, 999, 0.10),  # not the top rate: not judged
              point("slow_1i", "ferry-2req", 288, 290, 0.90),
              point("slow_1i", "triton-dyn0", 288, 280, 0.97)]
    found = {g.target.split(" at ")[0]: g for g in goals.slow_load_goals(points)}
    assert found["slow 2i"].met is True and "(1.10)" in found["slow 2i"].measured
    assert found["slow 1i"].met is False and "-7 points" in found["slow 1i"].measured


def test_cpu_is_ferrys_three_processes_median_over_rounds() -> None:
    points = [point("fast_1i", "ferry-2req", 400, 20, 0.5, cpu=c) for c in (600, 900, 650)]
    points += [point("fast_1i", "ferry-2req", 50, 20, 0.2, cpu=2500)]
    at400, at50 = goals.cpu_goals(points)
    assert at400.met is True and "POST + GET: 650 µs" in at400.measured
    assert at50.met is False and "2,500 µs" in at50.measured


def test_keeping_up_and_the_gap_come_from_the_fresh_stacks() -> None:
    runs = [{"ferry": {"p99_ms": p}, "triton": {"p99_ms": 300.0},
             "batches": {"gap_p50_ms": g, "gap_max_ms": 20.0}}
            for p, g in ((310.0, 0.8), (370.0, 1.4), (300.0, 0.9))]
    keep = goals.keep_up_goal(runs)
    assert keep.met is False and keep.measured.startswith("2 of 3 runs")
    gap = goals.gap_goal(runs)
    assert gap.met is True and "p50 0.9 ms" in gap.measured


def test_a_part_not_run_reads_not_measured_and_the_section_is_placed_once(
        tmp_path: Path) -> None:
    report = tmp_path / "BENCHMARKS.md"
    report.write_text(f"# Ferry\n\n## Targets\n\nx\n\n{GOODPUT_HEADING}\n\ny\n")
    goals.write(report, tmp_path)
    text = report.read_text()
    assert text.index(goals.HEADING) < text.index(GOODPUT_HEADING)
    assert "not measured" in text and "**0 of the 0 measured here met.**" in text
    (tmp_path / "keepup").mkdir()
    (tmp_path / "keepup" / "keepup.json").write_text(json.dumps([
        {"ferry": {"p99_ms": 300.0}, "triton": {"p99_ms": 290.0},
         "batches": {"gap_p50_ms": 3.0, "gap_max_ms": 9.0}}]))
    goals.write(report, tmp_path)
    text = report.read_text()
    assert text.count(goals.HEADING) == 1 and "1 of 1 runs" in text
    assert "**1 of the 2 measured here met.**" in text


def test_a_missed_target_says_why_once_per_reason_and_a_met_one_does_not() -> None:
    points = [point("fast_1i", "ferry-2req", 400, 20, 0.5, cpu=2500),
              point("fast_1i", "ferry-2req", 50, 20, 0.5, cpu=1500)]
    found = goals.cpu_goals(points)
    assert [g.met for g in found] == [False, True]
    lines = goals.reasons(found)
    assert lines[1] == "Why the missed ones missed:"
    assert len(lines) == 4 and lines[3].startswith("- CPU per inference at 400/s, fast backend: ")
    assert "docs/performance.md" in lines[3]
    assert goals.reasons(found[1:]) == []
