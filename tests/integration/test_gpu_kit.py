"""The GPU kit cannot rot: its dry run passes here, and the kit builds and rehearses its GPU run.

- ``scripts/gpu-kit.sh run --cpu``: the kit's steps on this machine's venv (Redis, Triton with the
  tiny numpy classifier four ways, Ferry, ``ferry plan fit``, perf_analyzer against both systems).
- ``scripts/gpu-kit.sh build`` then ``run --cpu --from-kit --redis-masters 3``: the packed kit,
  unpacked and run with a Python 3.12 that has numpy 2 and the other packages the GPU machine's
  image has (as the GPU run does, but for PyTorch and the GPU), Ferry on a Redis Cluster. This
  is the rehearsal that found the Python backend's BYTES inputs broken under numpy 2.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loadtest.gpukit import wheels

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "scripts" / "gpu-kit.sh"
QUICK = ["--budget-s", "70", "--instances", "1", "--interval-ms", "500"]
# The rehearsal runs Ferry on a Redis Cluster (``--redis-masters``), created with the kit's own
# redis-cli: the GPU machine has none.
# The plain dry run stops after the warm-up (its budget holds start-up, the check, the fit and a
# run through each system): the rehearsal below runs every step.
SHORT = ["--budget-s", "45", "--instances", "1", "--interval-ms", "400"]
BACKLOG_FULL = "unfinished tasks, the limit for normal priority is"  # a 429's message


def kit(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> str:
    done = subprocess.run([str(KIT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def assert_a_good_run(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / "gpu-kit.json").read_text())
    assert result["errors"] == []
    assert set(result["check"]) == {"triton", "ferry"}
    assert all(len(answer["top5"]) == 5 for answer in result["check"].values())
    assert result["fit"]["t_per_ms"] > 0 and result["capacity"]["1"] > 0
    by_system = {row["system"]: row for row in result["goodput"]}
    assert set(by_system) == {"triton", "ferry"}
    for row in by_system.values():  # each system served some rate within the SLO
        assert any(not p["errors"] for p in row["probes"]), row
    assert result["probes"] and all(p["inferences"] > 0 for p in result["probes"]
                                    if not p["measured"]["errors"])
    text = (out / "gpu-kit.md").read_text()
    assert "## Goodput at the SLO" in text and "## The model" in text
    assert "===== triton/triton.log" in (out / "logs.txt").read_text()
    return result


@pytest.mark.timeout(240)  # about 45 s: Triton, Redis and Ferry, a fit, a few perf_analyzer runs
def test_the_dry_run_measures_both_systems(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kit("run", "--cpu", "--out", str(out), "--work", str(tmp_path / "work"), *SHORT)
    result: dict[str, Any] = json.loads((out / "gpu-kit.json").read_text())
    assert result["errors"] == []
    assert all(len(answer["top5"]) == 5 for answer in result["check"].values())
    assert result["fit"]["t_per_ms"] > 0
    warm = {run["system"]: run for run in result["warm_up"]}
    assert set(warm) == {"triton", "ferry"}
    for system, run in warm.items():  # each system served its run, counted by Triton
        # Ferry refusing past its backlog limit (sized from a fit this shared machine may have
        # made slow) is Ferry doing its job; any other error is the kit's
        assert all(BACKLOG_FULL in error for error in run["measured"]["errors"]), run
        assert run["inferences"] > 0, run
        assert run["cpu_s"][system] > 0  # and the CPU of the system that served it was counted
    assert result["engines"]["tiny"]["engine"] == "tiny"
    assert result["machine"]["python"] == platform.python_version()
    if result["skipped"]:  # what did not fit in the budget is named
        assert "## Skipped" in (out / "gpu-kit.md").read_text()


def python_312() -> Path | None:
    """A Python 3.12 built with its shared library (as the stub for 3.12 needs)."""
    candidates = [shutil.which("python3.12") or "",
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", "import sysconfig; print(sysconfig.get_config_var"
                               "('Py_ENABLE_SHARED'))"], capture_output=True, text=True,
                              check=False)
        if done.stdout.strip() == "1":
            return Path(candidate)
    return None


def installer(venv: Path) -> list[str]:
    """What installs packages into ``venv``: the uv that make install put in Ferry's venv (a
    tenth of pip's time: 39 s for these), else the venv's own pip."""
    uv = ROOT / ".venv" / "bin" / "uv"
    if uv.exists():
        return [str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
    return [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]


@pytest.mark.timeout(600)  # the build is mostly xz (about 75 s); the run about 70 s
def test_the_kit_builds_and_its_gpu_run_rehearses_here(tmp_path: Path) -> None:
    python = python_312()
    if python is None:
        pytest.skip("no Python 3.12 with its shared library here to rehearse the GPU run with")
    packed = tmp_path / "kit"
    built = kit("build", env={"FERRY_KIT_DIR": str(packed)}, timeout=480)
    assert "MiB of 64" in built
    assert sorted(p.name for p in packed.iterdir()) == [
        "requirements.txt", "site.tar.xz", "tools.tar.xz", "triton.tar.xz"]
    machine = tmp_path / "machine"  # the GPU machine's python3: 3.12, numpy 2, its image's set
    subprocess.run([str(python), "-m", "venv", str(machine)], check=True, timeout=120)
    subprocess.run([*installer(machine), "numpy>=2.2", *sorted(wheels.PRESENT - {"numpy"})],
                   check=True, timeout=300, capture_output=True)
    out = tmp_path / "out"
    kit("run", "--cpu", "--from-kit", "--out", str(out), *QUICK, "--redis-masters", "3",
        env={"FERRY_KIT_DIR": str(packed), "FERRY_KIT_WORK": str(tmp_path / "work"),
             "PATH": f"{machine / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    result = assert_a_good_run(out)
    assert result["sizing"]["redis_masters"] == 3
    assert "a Redis Cluster of 3 masters" in (out / "gpu-kit.md").read_text()
    assert result["machine"]["python"].startswith("3.12.")
    assert result["machine"]["libpython"].endswith("libpython3.12.so.1.0")
    facts = result["engines"]["tiny"]
    assert facts["python"].startswith("3.12.") and facts["numpy"].startswith("1.")
