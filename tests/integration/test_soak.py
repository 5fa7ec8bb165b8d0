"""The chaos soak for a minute against real processes (three Redis nodes and three sentinels,
Triton, two gateways, two batchers): every kind of fault, and not one accepted task lost.

It runs ``python -m loadtest.soak`` as its own process (it starts and stops its own servers,
none of the session's), at a fixed rate rather than a share of a measured capacity, so that the
minute is the same on any machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.soak.plan import KINDS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SOAK_S = 60
# 12 slots of 4.5 s between 3 s and 57 s: one fault of each of the 12 kinds (dealt from a deck).
FAULT_EVERY_S = 4.5


def run_soak(tmp_path: Path) -> tuple[dict[str, Any], str]:
    out = tmp_path / "soak.json"
    argv = [sys.executable, "-m", "loadtest.soak", "--duration-s", str(SOAK_S), "--rate", "30",
            "--seed", "1", "--fault-every-s", str(FAULT_EVERY_S), "--drain-s", "30",
            "--out", str(out),
            "--state-dir", str(tmp_path / "state")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          check=False)
    assert out.exists(), f"no report; exit {done.returncode}:\n{done.stdout[-3000:]}\n" \
                         f"{done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    assert done.returncode == (0 if report["ok"] else 1)
    return report, done.stdout


@pytest.mark.timeout(300)
def test_a_minute_of_every_fault_loses_no_accepted_task(tmp_path: Path) -> None:
    report, output = run_soak(tmp_path)
    results = report["results"]
    assert results["lost"] == 0, json.dumps(report["lost_tasks"][:3], indent=1)
    assert results["wrong"] == 0, json.dumps(results["wrong_tasks"][:3], indent=1)
    assert set(report["fault_counts"]) == {k.name for k in KINDS}, output[-3000:]
    assert report["submissions"]["accepted"] >= 300
    assert results["finished"].get("SUCCESS", 0) >= 300
    minutes = report["latency_per_minute"]
    assert minutes and all(m["p99_ms"] > 0 for m in minutes)
    memory = report["memory"]
    labels = {s["label"] for s in memory["samples"]}
    assert {"gateway-0", "gateway-1", "batcher-0", "batcher-1", "triton", "soak"} <= labels
    assert sum(label.startswith("redis-") for label in labels) == 3
    assert any(t["mib_per_min"] is not None for t in memory["trends"])
