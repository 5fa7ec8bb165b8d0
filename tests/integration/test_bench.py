"""`make bench` works: a quick run of the same code writes the report, its figures and raw data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(600)  # the sweep, perf_analyzer's goodput searches, two fresh keep-up
# stacks, the bulk-jobs stack, the durability pair, the recovery part's one fault
def test_a_quick_benchmark_run_writes_the_report(tmp_path: Path) -> None:
    out, figures, state = tmp_path / "BENCH.md", tmp_path / "fig", tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "loadtest.bench", "--quick", "--out", str(out), "--figures",
         str(figures), "--state", str(state)], cwd=ROOT, capture_output=True, text=True,
        timeout=540, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = out.read_text()
    assert "## Targets" in report and "3. Light load (50/s)" in report
    for system in ("Ferry, 1 request (Prefer: wait)", "Ferry, POST + GET",
                   "Triton alone, dynamic batching (delay 0)", "Triton alone, no batching"):
        assert f"| {system} | 50 |" in report
    # the machine's own floors: a bare exchange at each rate (and twice it), a Redis command
    floors = json.loads((state / "floors.json").read_text())
    assert set(floors["exchange"]) == {"50.0", "400.0"} and floors["redis"] > 0
    assert "| a bare HTTP exchange (uvicorn, httptools, uvloop, answering {} at once) at 400/s |" \
        in report
    assert "CPU per inference against the client's bare exchanges, fast 1i, 400/s" in report
    assert "## Goodput at the SLO (perf_analyzer)" in report  # perf_analyzer's searches ran
    for protocol in ("grpc", "http"):
        assert f"| fast | 1 | {protocol} | 50 ms |" in report
    goodput = json.loads((state / "goodput.json").read_text())
    assert {(g["system"], g["protocol"]) for g in goodput} == {
        (system, protocol) for system in ("triton", "ferry") for protocol in ("grpc", "http")}
    assert all(g["probes"] for g in goodput)
    assert {g["system"] for g in goodput if g["variant"] == "pinned"} == {"triton", "ferry"}
    assert "Pinned (fast backend, 1 instance, gRPC)" in report
    assert any(g["rate"] > 0 for g in goodput if g["system"] == "triton")
    assert "## Keeping up at 78% of capacity (ten fresh stacks)" in report
    kept = json.loads((state / "keepup" / "keepup.json").read_text())
    assert [r["index"] for r in kept] == [1, 2]  # each run its own stack, Ferry then Triton
    # Every task answered: SUCCESS, or refused at admission (429: the backlog was full) when this
    # shared machine fell behind in a 3 s run; whether Ferry keeps up is the bench's to measure.
    assert all(set(r["failures"]) <= {"HTTP 429"} and r["batches"]["count"] > 0 for r in kept)
    assert all(r["ferry"]["failed"] == sum(r["failures"].values()) for r in kept)
    assert all(r["triton"]["p99_ms"] > 0 and r["depth"] for r in kept)
    burnt = json.loads((state / "keepup" / "keepup-burn.json").read_text())
    assert len(burnt) == 1 and burnt[0]["batches"]["count"] > 0  # beside the busy loop
    assert "With a busy loop of 0.5 of a core beside each run" in report
    assert "## Bulk jobs" in report and "job-batch-sizes.png" in report
    bulk = json.loads((state / "jobs.json").read_text())
    assert [p["batch"] for p in bulk["sizes"]] == [8, 64]
    assert all(p["failed"] == 0 and p["images_per_s"] > 0 for p in bulk["sizes"])
    assert bulk["hybrid"]["alone_errors"] == 0 and bulk["hybrid"]["with_job_errors"] == 0
    assert "## Against the Python peers\n\nNot measured in this run: the peers were left out" \
        in report  # a quick run never starts them (make test installs none)
    assert "## Durability: replica-acknowledged admission" in report
    assert "| master + replica, FERRY_REDIS_MIN_REPLICAS=1 | 50 |" in report
    # the recovery part: one fault, briefly, and said not to be a measurement
    assert "## Recovery: what each fault costs" in report and "**Not a measurement**" in report
    recovered = json.loads((state / "recovery" / "recovery.json").read_text())
    assert [(r["fault"], r["measured"]) for r in recovered] == [("kill-batcher", False)]
    assert recovered[0]["accepted"] > 0 and recovered[0]["lost"] == recovered[0]["wrong"] == 0
    for name in ("operating-curves.png", "cpu-per-inference.png", "job-batch-sizes.png"):
        assert (figures / name).read_bytes().startswith(PNG)
    points = json.loads((state / "results.json").read_text())
    ferry = [p for p in points if p["system"].startswith("ferry")]
    assert ferry and all(p["run"]["statuses"] == {"SUCCESS": p["run"]["count"], "TIMEOUT": 0}
                         for p in ferry)
    assert all(p["cpu_us"]["gateway"] > 0 and p["cpu_us"]["batcher"] > 0 for p in ferry)
    assert all(p["mean_batch"] >= 1 for p in points)
