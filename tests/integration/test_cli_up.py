"""`ferry up` as a user runs it: one command, a working API, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferry.stack.ports import free_port
from ferry.stack.up import bundled_repository, sample_image
from loadtest import generator
from tests.conftest import TritonServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (a per-test state directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline or text in environ:
            found.append(int(entry.name))
    return [pid for pid in found if pid != os.getpid()]


@contextmanager
def ferry_up(*args: str, state: Path) -> Iterator[tuple[subprocess.Popen[str], list[str], str]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferry", "up", "--port", str(port), "--state-dir", str(state),
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "FERRY_TEST_MARK": str(state)})
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        assert any("Ferry is up" in line for line in lines), "".join(lines)
        yield proc, lines, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def stop_and_check(proc: subprocess.Popen[str], state: Path) -> float:
    """Ctrl-C: every process stopped, exit code 130 and one line said so (no traceback)."""
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    took = time.monotonic() - started
    assert proc.stdout is not None
    said = proc.stdout.read()
    assert "ferry up: interrupted; stopping ...\n" in said and "Traceback" not in said, said
    time.sleep(0.5)
    assert processes_mentioning(str(state)) == [], "ferry up left processes behind"
    return took


def readme_rollout(base: str, state: Path) -> tuple[str, str]:
    """The README's two rollout commands against a ``ferry up`` stack, with the admin token it
    keeps in its state directory: what each printed."""
    printed = []
    for args in (["set", "moderation", "--stable", "1", "--candidate", "2", "--share", "5",
                  "--shadow", "10"], ["status", "moderation"]):
        done = subprocess.run([sys.executable, "-m", "ferry", "rollout", "--url", base, *args],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "FERRY_STATE_DIR": str(state)})
        assert done.returncode == 0, done.stdout + done.stderr
        printed.append(done.stdout)
    return printed[0], printed[1]


def test_ferry_up_serves_the_moderation_model_and_stops_cleanly(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    with ferry_up(state=state) as (proc, lines, base):
        banner = "".join(lines)
        assert f"{base}/v1/inference" in banner and "curl" in banner
        assert "infer calls over HTTP 127.0.0.1:" in banner  # the Triton it started: cheaper
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/readyz").status_code == 200
            accepted = client.post("/v1/inference", content=sample_image().read_bytes(),
                                   headers={"Content-Type": "image/jpeg"})
            assert accepted.status_code == 202
            result = client.get(accepted.json()["status_url"], params={"wait": 20}).json()
            assert result["status"] == "SUCCESS"
            labels = [d["label"] for d in result["output"]["DETECTIONS"]["detections"]]
            assert "FACE_FEMALE" in labels
            assert result["model_version"] == "1"  # its default version: 2 is a candidate
            assert "ferry_http_requests_total" in client.get("/metrics").text
        declared, status = readme_rollout(base, state)
        assert declared == "moderation: canary, stable 1, candidate 2 at 5%, shadow 10%, " \
            "generation 1\n"
        assert "share set 20" in status and " ago)" in status, status
        assert len(processes_mentioning(str(state))) >= 5  # ferry up, redis, triton, 2 services
        took = stop_and_check(proc, state)
    assert took < 20


def test_ferry_up_uses_an_existing_redis_and_triton(
    tmp_path: Path, redis_url: str, triton_server: TritonServer,
) -> None:
    state = tmp_path / "stack"
    with ferry_up("--redis-url", redis_url, "--triton-url", triton_server.grpc_url,
                  "--default-model", "sim", state=state) as (proc, lines, base):
        assert f"triton         gRPC {triton_server.grpc_url}\n" in "".join(lines)
        with httpx.Client(base_url=base, timeout=30) as client:
            accepted = client.post("/v1/inference", json={"input": "hello"})
            result = client.get(accepted.json()["status_url"], params={"wait": 20}).json()
        assert result["status"] == "SUCCESS" and result["model"] == "sim"
        # The open-loop load generator, briefly, through the real HTTP server: both flows.
        for flow in ("ferry-2req", "ferry-1req"):
            report = asyncio.run(generator.run(flow, base, "sim", rate=100, count=100))
            assert report.statuses == {"SUCCESS": 100, "TIMEOUT": 0}, flow
            assert 0 < report.p50_ms <= report.p99_ms
        # And Locust, for those who prefer it: every answer checked, none wrong.
        stats = run_locust(base, seconds=4)
        assert sum(s["num_requests"] for s in stats) > 0
        assert sum(s["num_failures"] for s in stats) == 0, stats
        stop_and_check(proc, state)


def run_locust(base: str, seconds: int) -> list[dict[str, Any]]:
    locust = Path(sys.executable).parent / "locust"
    done = subprocess.run(
        [str(locust), "-f", str(ROOT / "loadtest" / "locustfile.py"), "--host", base,
         "--headless", "--users", "5", "--spawn-rate", "5", "--run-time", f"{seconds}s",
         "--json", "--loglevel", "WARNING"], cwd=ROOT, capture_output=True, text=True,
        timeout=seconds + 60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    stats: list[dict[str, Any]] = json.loads(done.stdout)
    return stats


def test_ferry_up_serves_another_model_repository(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    shutil.copytree(bundled_repository() / "sim", repository / "sim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    state = tmp_path / "stack"
    with ferry_up("--model-repository", str(repository), state=state) as (proc, lines, base):
        assert "default model  sim" in "".join(lines)
        with httpx.Client(base_url=base, timeout=30) as client:
            accepted = client.post("/v1/inference", json={"input": "any model"})
            assert accepted.status_code == 202
            result = client.get(accepted.json()["status_url"], params={"wait": 20}).json()
            assert result["status"] == "SUCCESS"
            missing = client.post("/v1/inference", json={"model": "moderation", "input": "x"})
            assert missing.status_code == 404
        stop_and_check(proc, state)


def test_help_names_every_setting() -> None:
    text = subprocess.run([sys.executable, "-m", "ferry", "up", "--help"], check=True,
                          capture_output=True, text=True).stdout
    for flag, env in [("--model-repository", ""), ("--port", "FERRY_PORT"),
                      ("--triton-url", "FERRY_TRITON_URL"), ("--redis-url", "FERRY_REDIS_URL"),
                      ("--max-batch", "FERRY_MAX_BATCH"), ("--max-wait-ms", "FERRY_MAX_WAIT_MS"),
                      ("--partitions", "FERRY_PARTITIONS"),
                      ("--result-ttl-s", "FERRY_RESULT_TTL_S"),
                      ("--default-model", "FERRY_DEFAULT_MODEL")]:
        assert flag in text and env in text.replace("\n", " ").replace("  ", " ")
