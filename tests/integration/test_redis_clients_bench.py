"""`make bench`'s Redis clients part works: a quick run writes its section of the report, a row for
every client at every workload and concurrency, each with a figure, and every round's samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.bench.redis_clients import CONCURRENCY, HEADING, QUICK, WORKLOAD_NAMES, WORKLOADS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("ferry.resp", "redis-py", "coredis")


def test_a_quick_run_writes_a_row_for_every_client_and_workload(tmp_path: Path) -> None:
    out, state = tmp_path / "BENCH.md", tmp_path / "state"
    out.write_text("# Kept\n\n## Another section\n\nuntouched\n")
    done = subprocess.run(
        [sys.executable, "-m", "loadtest.bench", "--quick", "--only", "redis-clients",
         "--out", str(out), "--state", str(state)], cwd=ROOT, capture_output=True, text=True,
        timeout=90, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = out.read_text()
    assert report.startswith("# Kept\n\n## Another section\n\nuntouched\n")
    assert HEADING in report and "**Not a measurement**" in report
    section = report[report.index(HEADING):]
    rows = [line.split(" | ") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| workload", "|---"))]
    found = {(r[0].removeprefix("| "), int(r[1]), r[2]): r for r in rows}
    assert set(found) == {(WORKLOAD_NAMES[w], c, client) for w in WORKLOADS
                          for c in CONCURRENCY for client in CLIENTS}
    for row in found.values():
        cpu_us, rate = float(row[3]), float(row[4].replace(",", ""))
        assert cpu_us > 0 and rate > 0, row
        assert row[2] != "ferry.resp" or (row[5], row[6]) == ("1.00", "1.00")
    assert "spent the least client CPU per command in" in section
    samples = json.loads((state / "redis-clients" / "redis_clients.json").read_text())["samples"]
    turns = {(s["workload"], s["concurrency"], s["client"], s["round"]) for s in samples}
    assert len(samples) == len(turns) == len(found) * QUICK.rounds
    assert all(s["calls"] >= s["concurrency"] and s["wall_s"] > 0 for s in samples)
