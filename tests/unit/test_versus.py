"""The peers' section of BENCHMARKS.md (``loadtest.bench.versus``) from a sweep's points, and how
the bench finds a peer's processes (``loadtest.bench.peers``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.bench import peers, versus
from loadtest.bench.backends import FAST, SLOW, Scenario
from loadtest.bench.sweep import Point

FAST_1I = Scenario(FAST, 1)


def point(system: str, rate: float, p99: float, *, cpu: dict[str, float] | None = None,
          achieved: float | None = None, errors: int = 0, scenario: str = "fast_1i") -> Point:
    done = achieved if achieved is not None else rate
    statuses = {"SUCCESS": 100 - errors} | ({"HTTP 500": errors} if errors else {})
    return Point(scenario=scenario, system=system, offered_rps=rate,
                 run={"achieved_rps": done, "statuses": statuses, "count": 100,
                      "p99_ms": p99, "p50_ms": p99 / 3},
                 mean_batch=8.0, busy_fraction=0.5, cpu_us=cpu or {})


def sweep_points() -> list[Point]:
    ferry = {"gateway": 300.0, "batcher": 100.0, "redis": 50.0}
    ray = {"peer": 900.0, "peer/raylet": 200.0, "peer/ray::ServeRepli": 500.0,
           "peer/gcs_server": 150.0, "peer/python": 50.0}
    return [
        point("ferry-1req", 400, 20, cpu=ferry), point("ferry-1req", 800, 40, cpu=ferry),
        point("ferry-1req", 1200, 300, cpu=ferry, achieved=900),
        point("ferry-2req", 400, 25, cpu=ferry), point("ferry-2req", 800, 60, cpu=ferry),
        point("triton-dyn0", 400, 10), point("triton-dyn0", 800, 12),
        point("ray-serve", 400, 30, cpu=ray), point("ray-serve", 800, 45, cpu=ray, errors=2),
        point("bentoml", 400, 35, cpu={"peer": 600.0}), point("bentoml", 800, 48,
                                                               cpu={"peer": 600.0}),
        point("litserve", 400, 80, cpu={"peer": 450.0}),
    ]


def test_goodput_is_the_highest_rate_served_in_full_without_errors_under_the_slo() -> None:
    points = [*sweep_points(), point("bentoml", 10, 20, achieved=9.4, scenario="slow_1i")]
    # 94% of 10/s counted in the run's middle (a request is 2% there) with every answer right
    # and the p99 bounded: kept up
    assert versus.goodput(points, Scenario(SLOW, 1), "bentoml", 50.0) == 10.0
    # fast backend: SLO 50 ms. Ferry's 1200 fell short; Ray's 800 had errors; LitServe's p99 80.
    assert [versus.goodput(points, FAST_1I, s, 50.0) for s in
            ("ferry-1req", "ferry-2req", "ray-serve", "bentoml", "litserve")] == [
        800.0, 400.0, 400.0, 800.0, 0.0]


def test_cpu_is_compared_at_the_highest_rate_every_system_served() -> None:
    points = sweep_points()
    assert versus.common_rate(points, FAST_1I) == 400.0  # LitServe served 400, not 800
    table = "\n".join(versus.cpu_table(points, [FAST_1I]))
    assert "| fast_1i | 400 | 450 (300 + 100 + 50) | 450 (300 + 100 + 50) |" in table
    assert "900 (`ray::ServeRepli` 500, `raylet` 200, `gcs_server` 150)" in table


def test_the_section_gives_ratios_and_says_where_ferry_leads_and_trails() -> None:
    faults = [versus.FaultRun("ferry-1req", "kill -9 of its batcher", 144.0, 2160,
                              {"SUCCESS": 2160}, 900.0, 3_100.0, 4.25),
              versus.FaultRun("ray-serve", "kill -9 of 1 of its 2 worker processes", 144.0,
                              2160, {"SUCCESS": 2100, "HTTP 500": 60}, 400.0, 900.0)]
    text = "\n".join(versus.section(sweep_points(), [FAST_1I], faults, 50.0, "one run"))
    assert text.startswith(versus.HEADING)
    assert "| fast_1i | 50 ms | 800 | 400 | 800 | 400 | 800 | 0 |" in text
    assert "Ray Serve 2.00x, BentoML 1.00x, LitServe ∞" in text
    # kept up with, whatever the latency: Ferry's 1,200 fell short, Ray's 800 had 2% errors
    assert "| fast_1i | 800 | 800 | 800 | 400 | 800 | 400 |" in text
    assert "| Ray Serve | kill -9 of 1 of its 2 worker processes | 2,160 | 2,100 | **60** | " \
           "HTTP 500 60 | 400 | 900 | not measured |" in text  # a run from before (no trace)
    assert "| Ferry (1 request) | kill -9 of its batcher | 2,160 | 2,160 | **0** | - | 900 | " \
           "3,100 | 4.2 |" in text
    assert "**Ray Serve.** Ferry's goodput at the SLO is higher on fast_1i (800 against 400/s)." \
        in text
    assert "**BentoML.** Ferry's goodput at the SLO is the same on fast_1i (800 against 800/s)." \
        in text
    assert "none lost of 2,160; the tasks the killed batcher held waited there until the " \
           "batcher started in its place took them over" in text
    assert "answered late (max 3.1 s; the backlog back to normal 4.2 s after the kill)" in text
    assert "lost Ray Serve 60." in text
    assert "(p99 at fast_1i's lowest rate: Ray Serve 30 ms, BentoML 35 ms, LitServe 80 ms)" \
        in text


def test_the_kill_row_alone_replaces_its_table_and_sentence_and_nothing_else() -> None:
    old = [versus.FaultRun("ferry-1req", "kill -9 of its batcher", 144.0, 2160,
                           {"SUCCESS": 2160}, 32_604.0, 33_849.0),
           versus.FaultRun("litserve", "kill -9 of 1 of its 2 worker processes", 144.0, 2160,
                           {"SUCCESS": 2145, "ConnectionError": 15}, 286.0, 360.0)]
    report = "\n".join(["# B", "", *versus.section(sweep_points(), [FAST_1I], old, 50.0,
                                                    "one run"), "", "## Next", "kept"]) + "\n"
    new = [versus.FaultRun("ferry-1req", "kill -9 of its batcher", 144.0, 2160,
                           {"SUCCESS": 2160}, 2_900.0, 3_400.0, 4.75),
           versus.FaultRun("litserve", "kill -9 of 1 of its 2 worker processes", 144.0, 2160,
                           {"SUCCESS": 2140, "ConnectionError": 20}, 300.0, 380.0, 0.9)]
    text = versus.replace_faults(report, new, "This table: measured apart.")
    assert "33,849" not in text and "| 2,900 | 3,400 | 4.8 |" in text
    assert "| LitServe | kill -9 of 1 of its 2 worker processes | 2,160 | 2,140 | **20** | " \
           "ConnectionError 20 | 300 | 380 | 0.9 |" in text
    assert "for 1 s). This table: measured apart.\n\n| system |" in text
    assert "max 3.4 s; the backlog back to normal 4.8 s after the kill" in text
    assert "lost LitServe 20." in text
    before, after = report.splitlines(), text.splitlines()
    assert len(before) == len(after) and after[-3:] == ["", "## Next", "kept"]
    # the table's title (its note), its two rows and the sentence in the reading
    assert sum(a != b for a, b in zip(before, after, strict=True)) == 4
    with pytest.raises(ValueError, match="no kill -9 table"):
        versus.replace_faults("# B\n", new, "")


def test_without_a_peer_the_section_says_why() -> None:
    text = versus.section([point("ferry-1req", 400, 20)], [FAST_1I], [], 50.0,
                          "the peers' venv is missing")
    assert text == [versus.HEADING, "", "Not measured in this run: the peers' venv is missing."]


def test_a_peers_processes_are_grouped_by_name_and_its_workers_found_by_their_mark(
        tmp_path: Path) -> None:
    """A real process tree: a parent with two children, one marked as a worker."""
    mark = peers.WORKER_MARKS["ray-serve"]
    script = ("import os, subprocess, sys, time\n"  # the mark only in the child's command
              "a = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', "
              "os.environ['MARK']])\n"
              "b = subprocess.Popen(['sleep', '30'])\n"
              "print('up', flush=True); time.sleep(30)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              env={**os.environ, "MARK": mark})
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"up\n"
        peer = peers.Peer("ray-serve", tmp_path, "127.0.0.1:1", "m")
        peer.process = _Wrapped(parent.pid)  # type: ignore[assignment]
        groups = peer.groups("peer")
        assert len(groups["peer"]) == 3 and groups["peer"][0] == parent.pid
        assert len(groups["peer/sleep"]) == 1
        workers = peers.workers(peer)
        assert len(workers) == 1 and mark in peers.cmdline(workers[0])
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


class _Wrapped:
    def __init__(self, pid: int) -> None:
        self.pid = pid
