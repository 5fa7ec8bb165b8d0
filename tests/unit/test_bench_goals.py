"""The goodput targets' table of BENCHMARKS.md (``loadtest.bench.goals``), from raw results."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from loadtest.bench import goals
from loadtest.bench.__main__ import generated, restamp
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


def test_each_slo_told_is_a_target_of_its_own_name() -> None:
    found = goals.told_goals([
        goodput("slow_2i", "ferry-slo", "grpc", 509, slo=406, variant="slo"),
        goodput("slow_2i", "triton", "grpc", 605, slo=406),
        goodput("slow_2i", "ferry-slo", "grpc", 303, slo=200, variant="slo"),
        goodput("slow_2i", "triton", "grpc", 360, slo=200, variant="slo")])
    assert [g.target for g in found] == ["Goodput told the SLO of 406 ms, slow 2i, gRPC",
                                         "Goodput told the SLO of 200 ms, slow 2i, gRPC"]
    assert "; ".join(g.target for g in found) in goals.reasons(found)[-1]


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


def test_cpu_is_set_against_the_bare_exchanges_its_client_makes() -> None:
    """One request a task: one exchange at the rate; POST then GET: two, each at twice it."""
    points = [point("fast_1i", "ferry-1req", 400, 20, 0.5, cpu=600),
              point("fast_1i", "ferry-2req", 400, 20, 0.5, cpu=1500),
              point("fast_1i", "ferry-1req", 1200, 20, 0.5, cpu=900),
              point("fast_1i", "ferry-2req", 1200, 20, 0.5, cpu=1000)]
    floors = {"exchange": {"400.0": 500.0, "800.0": 400.0, "1200.0": 300.0, "2400.0": 250.0}}
    at400, at1200, at400_45, at1200_45 = goals.exchange_goals(points, floors)
    assert at400.met is False  # POST + GET: 1,500 / (2 * 400) = 1.9, over issue 36's 1.5
    assert "1 request: 600 µs, 1.2 times 1 of 500 µs" in at400.measured
    assert "POST + GET: 1,500 µs, 1.9 times 2 of 400 µs (a bare exchange at 800/s)" in \
        at400.measured
    assert at1200.met is False and "3.0 times 1 of 300 µs" in at1200.measured
    assert at400.target.endswith("400/s (issue 36)") and at400.goal.startswith("≤ 1.5 times")
    # issue 45's aims: 5 times at 400/s (met), 3 times at 1,200/s (1 request: 3.0, met)
    assert at400_45.target.endswith("400/s (issue 45)") and at400_45.goal.startswith("≤ 5.0 ")
    assert at400_45.met is True and at400_45.measured == at400.measured
    assert at1200_45.met is True and at1200_45.goal.startswith("≤ 3.0 times")
    points[2] = point("fast_1i", "ferry-1req", 1200, 20, 0.5, cpu=930)  # 3.1 times
    assert goals.exchange_goals(points, floors)[3].met is False
    assert goals.exchange_goals(points, {})[0].met is None  # no floors: not measured


def test_ferry_must_spend_less_than_every_peer_at_every_rate() -> None:
    def peer(name: str, rate: float, cpu: float) -> dict[str, Any]:
        return {"scenario": "fast_1i", "system": name, "offered_rps": rate,
                "cpu_us": {"peer": cpu}, "run": {}, "busy_fraction": 0}

    points = [point("fast_1i", "ferry-1req", 400, 20, 0.5, cpu=1000),
              point("fast_1i", "ferry-1req", 50, 20, 0.5, cpu=3000),
              peer("ray-serve", 400, 1900), peer("bentoml", 400, 1200),
              peer("litserve", 50, 2500), peer("litserve", 800, 500)]  # Ferry not at 800
    found = goals.peers_goal(points)
    assert found.met is False
    assert found.measured == ("more than a peer at 1 of 3 points: LitServe at 50/s "
                              "(3,000 against 2,500 µs)")
    assert goals.peers_goal(points[:1] + points[2:4]).met is True


def test_light_load_is_against_triton_alones_p50_and_p99() -> None:
    def at50(system: str, p50: float, p99: float) -> dict[str, Any]:
        return {"scenario": "fast_1i", "system": system, "offered_rps": 50.0,
                "run": {"p50_ms": p50, "p99_ms": p99}, "cpu_us": {}, "busy_fraction": 0}

    points = [at50("triton-dyn0", 7.0, 12.0), at50("triton-dyn0", 7.4, 14.0),
              at50("ferry-1req", 8.9, 21.0), at50("ferry-2req", 9.0, 30.0)]
    found = goals.light_goal(points)
    assert found.met is False  # POST + GET's p99 is 17 ms over
    assert "1 request: p50 8.9 (+1.7), p99 21.0 (+8.0) ms" in found.measured
    assert goals.light_goal(points[:3]).met is True


def test_grpc_goodput_on_the_fast_backend_with_the_pinned_search_beside_it() -> None:
    results = [goodput("fast_1i", "ferry", "grpc", 800, ceiling=3200, slo=50),
               goodput("fast_1i", "triton", "grpc", 1200, ceiling=3200, slo=50),
               goodput("fast_1i", "ferry", "grpc", 500, ceiling=3200, slo=50, variant="pinned"),
               goodput("fast_1i", "triton", "grpc", 1000, ceiling=3200, slo=50,
                       variant="pinned")]
    issue36, issue45 = goals.grpc_goodput_goals(results)
    assert (issue36.met, issue45.met) == (True, False)  # 0.67: over 0.6, under 0.8
    assert issue36.measured == issue45.measured == ("shared cores: 800/s vs 1,200/s (0.67); "
                                                    "pinned: 500/s vs 1,000/s (0.50)")
    assert (issue36.goal, issue45.goal) == ("Ferry / Triton alone ≥ 0.6",
                                            "Ferry / Triton alone ≥ 0.8")
    assert all(g.met is None for g in goals.grpc_goodput_goals(results[2:]))  # pinned only


def test_the_reports_first_line_gives_the_whole_runs_time_once_every_section_is_written(
        tmp_path: Path) -> None:
    started = datetime.datetime(2026, 11, 29, 5, 6, tzinfo=datetime.UTC)
    report = tmp_path / "BENCHMARKS.md"
    report.write_text("\n".join(["# Ferry against Triton alone", "",
                                 generated("make bench", started, 30.2), "", "- machine"]))
    restamp(report, generated("make bench", started, 77.4, sweep_minutes=30.2))
    lines = report.read_text().split("\n")
    assert lines[2].startswith("Generated by `make bench` on 2026-11-29 05:06 UTC in 77.4 "
                               "minutes (30.2 of them until the sweep's report, ")
    assert lines[0] == "# Ferry against Triton alone" and lines[4] == "- machine"
    assert sum(line.startswith("Generated by") for line in lines) == 1
