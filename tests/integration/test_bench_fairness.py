"""The bench's fair-share part works: its smoke run (a flood beside a light client, FIFO and fair
share, and the light client alone, a few seconds each) writes its section, figure and raw data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(240)  # about 40 s: one Triton and Redis, three fresh gateways and batchers
def test_a_quick_fairness_run_writes_its_section(tmp_path: Path) -> None:
    out, figures, state = tmp_path / "BENCH.md", tmp_path / "fig", tmp_path / "state"
    out.write_text("# Bench\n\n## Another part\n\nkept\n")
    done = subprocess.run(
        [sys.executable, "-m", "loadtest.bench", "--only", "fairness", "--quick", "--out",
         str(out), "--figures", str(figures), "--state", str(state)], cwd=ROOT,
        capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = out.read_text()
    assert "## Another part\n\nkept" in report  # the rest of --out is left as it was
    assert "## Fair share: a flood and a light client" in report
    assert "**Not a measurement**" in report and "fair-share-light-client.png" in report
    assert (figures / "fair-share-light-client.png").read_bytes().startswith(PNG)
    runs = {r["mode"]: r for r in json.loads((state / "fairness" / "fairness.json").read_text())}
    assert list(runs) == ["alone", "fifo", "fair"]
    assert [runs[m]["fair_after"] for m in runs] == [4, 0, 4]
    for run in runs.values():
        light = run["light"]
        # every light request ended: answered with its own input's answer, or refused (429)
        assert light["sent"] > 0 and not light["errors"], light
        assert light["answered"] + light["refused"] == light["sent"]
        assert len(light["latencies_ms"]) == light["answered"] > 0
        assert 0 < run["busy"] <= 1.05 and run["ran_per_s"] > 0 and not run["measured"]
    assert runs["alone"]["flood"] is None
    for mode in ("fifo", "fair"):
        flood = runs[mode]["flood"]
        assert flood["sent"] > 1000 and not flood["errors"], flood
        assert flood["accepted"] + flood["refused"] == flood["sent"] and flood["accepted"] > 0
    assert f"| light client alone | {runs['alone']['light']['sent']} / " in report
