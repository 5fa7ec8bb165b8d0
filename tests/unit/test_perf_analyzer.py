"""perf_analyzer's output read into typed results, and the goodput search, without servers.

The files in tests/unit/data/perf_analyzer/ are what perf_analyzer 2.41 wrote in real runs against
Ferry's gateway over HTTP (model sim, 2 KB BYTES inputs from ``bytes_inputs``):

    perf_analyzer -m sim -u 127.0.0.1:PORT -i http --async --request-rate-range 50
      --request-distribution poisson --measurement-interval 1000 --percentile=99
      --stability-percentage 100000 --max-trials 3 --max-threads 1 --input-data sim.json
      -f ferry_http_sim.csv > ferry_http_sim.out
    (the same with -H "Content-Encoding: gzip": every request refused; no CSV) > ..._refused.out
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from loadtest.bench.backends import FAST, SLOW, Scenario
from loadtest.bench.goodput import (
    HEADING,
    Bracket,
    Goodput,
    good,
    inputs_needed,
    interval_ms,
    replace_section,
    search,
    section,
    slo_ms,
)
from loadtest.bench.perf_analyzer import (
    Load,
    Measurement,
    bytes_inputs,
    fp32_inputs,
    interpret,
    parse_count,
    parse_csv,
    parse_errors,
)

DATA = Path(__file__).parent / "data" / "perf_analyzer"
CSV = (DATA / "ferry_http_sim.csv").read_text()
OUT = (DATA / "ferry_http_sim.out").read_text()
REFUSED = (DATA / "ferry_http_refused.out").read_text()


def test_the_csv_report_reads_as_typed_rows() -> None:
    [row] = parse_csv(CSV)
    assert row == Measurement(rate=50.0, throughput=37.9064, p50_ms=11.108, p90_ms=18.407,
                              p95_ms=20.874, p99_ms=25.055)


def test_a_run_that_succeeded_is_its_last_row_with_the_request_count() -> None:
    measured = interpret(50.0, 0, OUT, CSV)
    assert measured.ok and measured.errors == ()
    assert measured.requests == parse_count(OUT) == 137
    assert (measured.rate, measured.p99_ms) == (50.0, 25.055)


def test_a_run_whose_requests_failed_says_why() -> None:
    assert parse_errors(REFUSED) == ("the body is not valid gzip: Error -3 while decompressing "
                                     "data: incorrect header check",)
    measured = interpret(50.0, 99, REFUSED, "")
    assert not measured.ok and measured.throughput == 0 and math.isinf(measured.p99_ms)
    assert measured.errors == parse_errors(REFUSED)


def test_an_exit_without_a_request_error_keeps_the_last_lines() -> None:
    output = "error: failed to get model metadata: HTTP client failed: Couldn't connect\n"
    measured = interpret(20.0, 99, output, "")
    assert measured.errors == ("perf_analyzer exited 99: error: failed to get model metadata: "
                               "HTTP client failed: Couldn't connect",)
    assert parse_count(output) == 0


def test_a_load_is_one_bounded_poisson_run(tmp_path: Path) -> None:
    load = Load("127.0.0.1:8001", "sim", 400.0, "grpc", shapes=("INPUT:1",),
                input_data=tmp_path / "in.json", interval_ms=1000, headers=("A:b",))
    argv = load.argv(tmp_path / "out.csv")
    joined = " ".join(argv[1:])
    for part in ("-m sim", "-u 127.0.0.1:8001", "-i grpc", "--async",
                 "--request-rate-range 400 ", "--request-distribution poisson",
                 "--measurement-interval 1000", "--percentile=99", "--max-trials 3",
                 "--max-threads 1", f"-f {tmp_path / 'out.csv'}", "--shape INPUT:1",
                 f"--input-data {tmp_path / 'in.json'}", "-H A:b"):
        assert part in joined
    assert load.timeout_s == pytest.approx(3 * 1.2 + 10.0)


def test_bytes_inputs_are_distinct_and_sized(tmp_path: Path) -> None:
    path = bytes_inputs(tmp_path / "in.json", "INPUT", 50, size=64, tag="run7-")
    steps = json.loads(path.read_text())["data"]
    contents = [step["INPUT"]["content"][0] for step in steps]
    assert len(set(contents)) == 50 and all(len(c) == 64 for c in contents)
    assert all(step["INPUT"]["shape"] == [1] and c.startswith("run7-")
               for step, c in zip(steps, contents, strict=True))


def test_fp32_inputs_are_distinct_rows(tmp_path: Path) -> None:
    steps = json.loads(fp32_inputs(tmp_path / "in.json", ("A", "B"), 16, 30).read_text())["data"]
    rows = {(tuple(step["A"]), tuple(step["B"])) for step in steps}
    assert len(rows) == 30 and all(len(step["A"]) == len(step["B"]) == 16 for step in steps)


def test_the_slo_of_each_backend() -> None:
    assert slo_ms(Scenario(FAST, 1), 50.0) == 50.0
    assert slo_ms(Scenario(SLOW, 2), 50.0) == 2 * (50 + 2 * 64) + 50.0


def _m(rate: float, p99: float, served: float = 1.0, errors: tuple[str, ...] = ()) -> Measurement:
    return Measurement(rate, rate * served, p99 / 2, p99, p99, p99, 100, errors)


def test_a_rate_is_good_when_served_under_the_slo_without_error() -> None:
    assert good(_m(100, 49.0), 50.0)
    assert not good(_m(100, 51.0), 50.0)
    assert not good(_m(100, 10.0, served=0.7), 50.0)
    assert not good(_m(100, 10.0, errors=("refused",)), 50.0)


async def _run(threshold: float, ceiling: float = 3200.0, start: float = 0.25) -> Goodput:
    """The search against a system whose p99 crosses the SLO above ``threshold``/s."""

    async def probe(rate: float) -> Measurement:
        return _m(rate, 10.0 if rate <= threshold else 500.0)

    result = Goodput("fast_1i", "ferry", "grpc", 50.0, ceiling)
    return await search(probe, result, start=start)


@pytest.mark.parametrize("threshold", [300.0, 1000.0, 1500.0, 2500.0])
async def test_the_search_brackets_the_goodput_within_its_resolution(threshold: float) -> None:
    result = await _run(threshold)
    assert 0 < result.rate <= threshold
    assert result.rate * 1.2 >= threshold * 0.95  # the next rate up was bad, within 20%
    assert len(result.probes) <= 6
    assert result.at is not None and result.at.rate == result.rate


async def test_the_search_stops_at_the_capacity_when_everything_is_good() -> None:
    result = await _run(1e9)
    assert result.rate == 3200.0 and result.capped
    assert [p.rate for p in result.probes] == [800.0, 1600.0, 3200.0]


async def test_the_search_halves_down_to_a_floor_when_nothing_is_good() -> None:
    result = await _run(0.0, ceiling=16.0)
    assert result.rate == 0.0 and result.at is None
    assert [p.rate for p in result.probes] == [4.0, 2.0, 1.0]


async def test_the_search_stops_after_two_failed_runs_in_a_row() -> None:
    async def probe(rate: float) -> Measurement:
        return Measurement.failed(rate, ["parameter 'x' is not supported"])

    result = await search(probe, Goodput("fast_1i", "ferry", "grpc", 50.0, 3200.0))
    assert [p.rate for p in result.probes] == [800.0, 400.0] and result.rate == 0.0
    [line] = [x for x in section([result], [Scenario(FAST, 1)], "") if x.startswith("- ")]
    assert line.endswith("400/s → the same error ✗")


def test_the_bracket_bisects_geometrically() -> None:
    bracket = Bracket(start=800.0, ceiling=3200.0)
    bracket.record(800.0, True)
    bracket.record(1600.0, False)
    assert bracket.next_rate() == round(math.sqrt(800 * 1600))
    bracket.record(1131.0, True)
    bracket.record(1345.0, False)
    assert bracket.next_rate() is None  # 1345 / 1131 is within 20%


def test_run_lengths_and_inputs_follow_the_rate() -> None:
    assert interval_ms(50.0, quick=False) == 2000
    assert interval_ms(3000.0, quick=False) == 1000
    assert interval_ms(3000.0, quick=True) == 500
    assert inputs_needed(1000.0, 1000) > 1000 * 3 * 1.2


def test_the_section_has_one_row_per_protocol_and_every_run() -> None:
    scenario = Scenario(FAST, 1)
    triton = Goodput("fast_1i", "triton", "grpc", 50.0, 3200.0, 1600.0, _m(1600, 30.0),
                     [_m(1600, 30.0), _m(3200, 500.0)])
    ferry = Goodput("fast_1i", "ferry", "grpc", 50.0, 3200.0, 800.0, _m(800, 40.0),
                    [_m(800, 40.0), _m(1600, 0.0, errors=("refused",))])
    lines = section([triton, ferry], [scenario], "how")
    assert lines[0] == HEADING
    assert ("| fast | 1 | grpc | 50 ms | 1,600/s (1,600 served) | 30.0 ms | 800/s (800 served) "
            "| 40.0 ms | 0.50 |") in lines
    assert any("1,600/s → error: refused ✗" in line for line in lines)


def test_told_the_slo_rows_sit_beside_triton_alone_and_plain_ferry_at_the_same_slo() -> None:
    scenario = Scenario(SLOW, 2)
    rows = [Goodput("slow_2i", "triton", "grpc", 406.0, 719.0, 600.0, _m(600, 350.0), []),
            Goodput("slow_2i", "ferry", "grpc", 406.0, 719.0, 500.0, _m(500, 300.0), []),
            Goodput("slow_2i", "ferry-slo", "grpc", 406.0, 719.0, 600.0, _m(600, 380.0), [],
                    variant="slo"),
            Goodput("slow_2i", "triton", "grpc", 200.0, 719.0, 400.0, _m(400, 190.0), [],
                    variant="slo"),
            Goodput("slow_2i", "ferry", "grpc", 200.0, 719.0, 360.0, _m(360, 180.0), [],
                    variant="slo"),
            Goodput("slow_2i", "ferry-slo", "grpc", 200.0, 719.0, 480.0, _m(480, 195.0), [],
                    variant="slo")]
    lines = section(rows, [scenario], "how")
    assert ("| slow | 2 | grpc | 406 ms | 600/s (600 served) | 350.0 ms | 500/s (500 served) "
            "| 300.0 ms | 0.83 |") in lines  # the main table keeps its own runs
    assert ("| slow | 2 | 406 ms | 600/s (600 served) | 500/s (500 served) | 600/s (600 served) "
            "| 380.0 ms | 1.00 | 1.20 |") in lines
    assert ("| slow | 2 | 200 ms | 400/s (400 served) | 360/s (360 served) | 480/s (480 served) "
            "| 195.0 ms | 1.20 | 1.33 |") in lines
    assert any("Ferry told the SLO over grpc (SLO 200 ms)" in line for line in lines)
    assert not any("Told the SLO" in line for line in section(rows[:2], [scenario], "how"))


def test_the_fixed_rate_table_puts_each_systems_p99_side_by_side() -> None:
    def ladder(system: str, p99s: tuple[float, float]) -> Goodput:
        return Goodput("slow_2i", system, "grpc", 200.0, 719.0, 0.0, None,
                       [_m(324, p99s[0]), _m(360, p99s[1])], variant="ladder")
    rows = [ladder("triton", (150.0, 230.0)), ladder("ferry", (190.0, 260.0)),
            ladder("ferry-slo", (170.0, 195.0))]
    lines = section(rows, [Scenario(SLOW, 2)], "how")
    assert "| asked/s | Triton alone | Ferry | Ferry told the SLO |" in lines
    assert ("| 360 | 230.0 (360/s) ✗ | 260.0 (360/s) ✗ | 195.0 (360/s) ✓ |") in lines
    assert any("Ferry told the SLO over grpc (SLO 200 ms, fixed rates)" in line for line in lines)


def test_the_section_replaces_its_old_self_and_nothing_else() -> None:
    report = "\n".join(["# Report", "", "## Targets", "t", "", HEADING, "", "old", "",
                        "## Figures", "f"]) + "\n"
    updated = replace_section(report, [HEADING, "", "new"])
    assert updated == "\n".join(["# Report", "", "## Targets", "t", "", HEADING, "", "new",
                                 "", "## Figures", "f"]) + "\n"
    assert replace_section("# Report\n", [HEADING, "new"]) == f"# Report\n\n{HEADING}\nnew\n"
    full = "## Targets\nt\n\n## Reading the results\nr\n"
    assert replace_section(full, [HEADING, "new"]) == (
        f"## Targets\nt\n\n{HEADING}\nnew\n\n## Reading the results\nr\n")
