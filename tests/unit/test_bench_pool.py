"""The pool part's pure logic (loadtest.bench.pool_report): the capacity its rates come from,
the figures of each side, the goals' verdicts and the section's rows; no server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadtest.bench.backends import SLOW
from loadtest.bench.pool import QUICK, Plan, rates
from loadtest.bench.pool_report import (
    HEADING,
    Row,
    Side,
    capacity,
    cells,
    lines,
    percentile,
    verdicts,
)


def test_the_capacity_is_every_instance_of_every_server_at_full_batches() -> None:
    # 64 items in t(64) = 50 + 2·64 = 178 ms, per instance of each server
    assert capacity(SLOW, 1) == pytest.approx(64 / 0.178)
    assert capacity(SLOW, 2) == pytest.approx(2 * 64 / 0.178)
    assert capacity(SLOW, 2, instances=2) == pytest.approx(4 * 64 / 0.178)


def test_each_configuration_runs_78_percent_of_its_pool_then_50_a_second() -> None:
    assert rates(1) == [("78%", 280.0), ("50/s", 50.0)]
    assert rates(2) == [("78%", 561.0), ("50/s", 50.0)]


def test_the_full_plan_covers_one_and_two_servers_with_one_two_and_four_batchers() -> None:
    assert Plan().configs == ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4))
    assert Plan().servers == 2 and QUICK.servers == 2 and len(QUICK.configs) == 1


def test_percentiles_are_nearest_rank() -> None:
    ordered = [float(v) for v in range(1, 101)]
    assert percentile(ordered, 50) == 50.0
    assert percentile(ordered, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_a_side_counts_done_goodput_shares_and_mean_batch() -> None:
    latencies = [100.0] * 90 + [500.0] * 8  # 98 answered of 100 sent, 90 within 406 ms
    side = Side.measured("ferry", latencies, sent=100, seconds=2.0, slo_ms=406.0,
                         calls={"a": 30, "b": 10}, inferences={"a": 300, "b": 100})
    assert side.done == pytest.approx(0.98)
    assert side.within_slo == 90 and side.goodput == pytest.approx(45.0)
    assert side.p50_ms == 100.0 and side.p99_ms == 500.0
    assert side.shares() == {"a": 0.75, "b": 0.25}
    assert side.mean_batch == pytest.approx(10.0)
    idle = Side.measured("triton", [], sent=0, seconds=0.0, slo_ms=406.0)
    assert (idle.done, idle.goodput, idle.mean_batch, idle.p99_ms) == (0.0, 0.0, 0.0, None)


def side(system: str, *, answered: int = 100, p99: float = 100.0,
         calls: dict[str, int] | None = None, batch: float = 10.0, **more: Any) -> Side:
    calls = calls or {"a": 50, "b": 50}
    return Side(system, 100, answered, answered, 10.0, p99 / 2, p99, calls=calls,
                inferences={k: round(v * batch) for k, v in calls.items()}, **more)


def row(*, servers: int = 2, ferry: Side | None = None, triton: Side | None = None) -> Row:
    return Row(servers, 2, "78%", 561.0, ferry or side("ferry"), triton or side("triton"))


def test_ratios_are_ferrys_over_triton_alones() -> None:
    r = row(ferry=side("ferry", p99=120.0, batch=9.0), triton=side("triton", p99=100.0))
    assert r.p99_ratio == pytest.approx(1.2) and r.batch_ratio == pytest.approx(0.9)
    empty = row(triton=Side("triton", 10, 0, 0, 1.0, None, None))
    assert empty.p99_ratio is None and empty.batch_ratio is None


def test_every_goal_held_is_said_so_and_each_miss_names_its_row() -> None:
    held = row()
    missed = Row(2, 4, "50/s", 50.0,
                 side("ferry", answered=97, p99=130.0, calls={"a": 70, "b": 30}, batch=8.0),
                 side("triton", p99=100.0))
    one_server = row(servers=1, ferry=side("ferry", calls={"a": 100}),
                     triton=side("triton", calls={"a": 100}))
    said = verdicts([held, missed, one_server])
    assert said == [
        "- done ≥ 0.98: held in 2 of 3 rows; missed: 2 servers, 4 batchers, 50/s.",
        "- p99 ratio ≤ 1.2: held in 2 of 3 rows; missed: 2 servers, 4 batchers, 50/s.",
        # one server: no share to judge
        "- each server's share of the calls 0.4-0.6: held in 1 of 2 rows; missed: 2 servers, "
        "4 batchers, 50/s.",
        "- mean batch ratio ≥ 0.9: held in 2 of 3 rows; missed: 2 servers, 4 batchers, 50/s."]
    assert verdicts([held])[0] == "- done ≥ 0.98: held in 1 of 1 rows (**all**)."


def test_a_row_shows_both_systems_and_marks_its_misses_in_bold() -> None:
    r = Row(2, 4, "78%", 561.0,
            side("ferry", answered=99, p99=150.0, calls={"a": 70, "b": 30}, batch=12.0),
            side("triton", p99=100.0, batch=36.0))
    assert cells(r) == ["2", "4", "78%", "561", "99.0% / 100.0%", "10 / 10", "75 / 50",
                        "150 / 100", "**1.50**", "**70% / 30%**", "50% / 50%", "12.0 / 36.0",
                        "**0.33**"]


def test_the_section_has_its_heading_goals_table_and_what_failed() -> None:
    failed = row(ferry=side("ferry", answered=97, failures={"TIMEOUT": 3}, late_sends=4))
    text = lines([failed], "How it was measured.")
    assert text[:3] == [HEADING, "", "How it was measured."]
    assert text[4].startswith("**Goals** (ratios): Ferry answers ≥ 0.98")
    assert sum(line.startswith("| 2 | 2 | 78% |") for line in text) == 1
    assert "Requests not answered: 2 servers, 2 batchers, 78%, Ferry: TIMEOUT 3." in text
    assert any("2 servers, 2 batchers, 78%: 4 / 0." in line for line in text)


def test_rows_round_trip_through_their_raw_json() -> None:
    r = row(ferry=side("ferry", failures={"TIMEOUT": 1}))
    assert Row.from_json(json.loads(json.dumps(r.to_json()))) == r


def test_the_machines_cpu_busy_is_reported_for_both_sides_where_measured() -> None:
    measured = row(ferry=side("ferry", busy_cores=1.86), triton=side("triton", busy_cores=0.7))
    unmeasured = row()  # raw results from before the figure was kept
    text = lines([measured, unmeasured], "How.")
    busy = [line for line in text if line.startswith("The machine's CPU busy")]
    assert len(busy) == 1 and busy[0].endswith("2 servers, 2 batchers, 78%: 1.86 / 0.70.")
    assert not any(line.startswith("The machine's CPU busy") for line in lines([unmeasured], ""))
