"""`ferry up` as a user runs it (`make up`): one command, a working API, a banner whose example
answers, docs/jobs.md's examples running as written, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferry.cli import main
from ferry.stack.ports import free_port
from ferry.stack.up import bundled_repository, sample_image, samples_source
from loadtest import generator
from tests.conftest import TritonServer
from tests.tensor_models import STANDIN, TENSOR_MODELS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
JOBS_DOC = ROOT / "docs" / "jobs.md"
SHELL_BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# A doc line that is meant to fail says so: `command   # 409 nothing_to_retry: why`.
REFUSED_LINE = re.compile(r"^(?P<command>[^#]*\S)\s+#\s*(?P<answer>4\d\d \w+)", re.MULTILINE)
FAILED = "doc example failed: "


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


def make_up(*args: str) -> tuple[list[str], dict[str, str]]:
    """``make up ARGS="..."`` as a user types it (in its own session, as a terminal's
    foreground group: Ctrl-C reaches make and ``ferry up`` both), with this venv's ``ferry``,
    and without re-installing (``-o``: a stale stamp must not run pip in a test)."""
    argv = ["make", "-C", str(ROOT), "--no-print-directory", "-o", ".venv/.installed", "up",
            f"BIN={Path(sys.executable).parent}", f"ARGS={' '.join(args)}"]
    # A make above this test (make test) leaves its flags and jobserver in the environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    return argv, env


@contextmanager
def ferry_up(*args: str, state: Path, via_make: bool = False,
             ) -> Iterator[tuple[subprocess.Popen[str], list[str], str]]:
    port = free_port()
    flags = ["--port", str(port), "--state-dir", str(state), *args]
    argv, env = make_up(*flags) if via_make else \
        ([sys.executable, "-m", "ferry", "up", *flags], dict(os.environ))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, "FERRY_TEST_MARK": str(state)},
                            start_new_session=via_make)
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
            interrupt(proc, group=via_make)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def interrupt(proc: subprocess.Popen[str], group: bool) -> None:
    """Ctrl-C: to ``proc`` alone, or (``group``) to its whole process group, as a terminal
    sends it to its foreground job."""
    if group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)


def stop_and_check(proc: subprocess.Popen[str], state: Path, via_make: bool = False) -> float:
    """Ctrl-C: every process stopped, one line said so (no traceback), and the stop counts as
    the success it is: ``ferry up`` exits 0, so ``make up`` reports no error. (GNU make itself,
    hit by the same Ctrl-C, then ends by that signal, after its recipe, as it always does.)"""
    started = time.monotonic()
    interrupt(proc, group=via_make)
    code = proc.wait(30)
    took = time.monotonic() - started
    assert proc.stdout is not None
    said = proc.stdout.read()
    assert "ferry up: interrupted; stopping ...\n" in said and "Traceback" not in said, said
    assert "make: ***" not in said, said  # no "make: *** [Makefile:…: up] Error 130"
    assert code in ((0, -signal.SIGINT) if via_make else (0,)), (code, said)
    # What ferry up stopped may still be exiting (a Triton backend's stubs): gone within 10 s,
    # or left behind.
    deadline = time.monotonic() + 10
    while (left := processes_mentioning(str(state))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], "ferry up left processes behind"
    return took


def banner_request(lines: list[str], base: str) -> dict[str, Any]:
    """Run the request the banner suggests, as printed, and wait for its task: its record."""
    banner = "".join(lines)
    curl = banner.split("then its result):\n", 1)[1].splitlines()[0].strip()
    assert curl.startswith("curl ") and f"'{base}/v1/inference?model=" in curl, banner
    done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60,
                          check=True)
    accepted = json.loads(done.stdout)
    record: dict[str, Any] = httpx.get(f"{base}{accepted['status_url']}",
                                       params={"wait": 20}, timeout=30).json()
    return record


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


def run_doc_examples(page: Path, base: str, cwd: Path) -> list[str]:
    """Each shell block of ``page``, as a user pastes it (from the repository's root, with
    ``ferry`` on the PATH) against the stack at ``base``: what each printed. Every command
    succeeds but those the page says are refused (``# 409 code``), which are, with that code."""
    (cwd / "services").symlink_to(ROOT / "services")  # the root's paths, the files written here
    env = {**os.environ, "FERRY_URL": base,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    printed = []
    for block in SHELL_BLOCK.findall(page.read_text()):
        script = f"set -o pipefail\ntrap 'echo \"{FAILED}$BASH_COMMAND\" >&2' ERR\n" + \
            block.replace("localhost:8000", base.removeprefix("http://"))
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=90, check=False)
        said = done.stdout + done.stderr
        failed = [line.removeprefix(FAILED) for line in done.stderr.splitlines()
                  if line.startswith(FAILED)]
        refused = REFUSED_LINE.findall(block)
        assert failed == [command for command, _ in refused], said
        assert all(answer in said for _, answer in refused), said
        printed.append(said)
    return printed


def check_jobs_doc(base: str, cwd: Path) -> None:
    """docs/jobs.md as written: the manifest (its ``uri`` item read from the samples ``ferry
    up`` allows) runs whole, by curl and by ``ferry jobs``, and so does a directory."""
    by_curl = run_doc_examples(JOBS_DOC, base, cwd)[0]
    assert '"status":"queued"' in by_curl and '"total":4' in by_curl, by_curl
    assert "error" not in by_curl, by_curl
    results = [json.loads(line) for line in (cwd / "results.jsonl").read_text().splitlines()]
    assert sorted((r["custom_id"], r["status"]) for r in results) == [
        (c, "succeeded") for c in "abcd"]
    photo, = [json.loads(line) for line in (cwd / "photos.jsonl").read_text().splitlines()]
    assert photo["custom_id"] == "grace_hopper.jpg" and photo["status"] == "succeeded"
    assert (cwd / "r.jsonl").read_text().count("\n") == 1  # the newest job: the photo's


def test_make_up_serves_the_moderation_model_and_stops_cleanly(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    with ferry_up(state=state, via_make=True) as (proc, lines, base):
        banner = "".join(lines)
        assert "infer calls over HTTP 127.0.0.1:" in banner  # the Triton it started: cheaper
        assert f"job sources    {samples_source()}\n" in banner
        suggested = banner_request(lines, base)  # the photo, to moderation
        assert suggested["status"] == "SUCCESS" and suggested["model"] == "moderation"
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
        (tmp_path / "docs").mkdir()
        check_jobs_doc(base, tmp_path / "docs")
        assert len(processes_mentioning(str(state))) >= 5  # ferry up, redis, triton, 2 services
        took = stop_and_check(proc, state, via_make=True)
    assert took < 20


def test_ferry_up_uses_an_existing_redis_and_triton(
    tmp_path: Path, redis_url: str, triton_server: TritonServer,
) -> None:
    state = tmp_path / "stack"
    with ferry_up("--redis-url", redis_url, "--triton-url", triton_server.grpc_url,
                  "--default-model", "sim", "--log-models", "sim=0.5",
                  state=state) as (proc, lines, base):
        assert f"triton         gRPC {triton_server.grpc_url}\n" in "".join(lines)
        # the inference log's logger, its /metrics where the banner says
        logger = re.search(r"  logger         metrics (http://\S+/metrics), records in (\S+)\n",
                           "".join(lines))
        assert logger is not None and logger[2] == str(state / "inference-log")
        assert "ferry_log_written_total" in httpx.get(logger[1], timeout=10).text
        suggested = banner_request(lines, base)  # its models' configs are elsewhere: a text
        assert suggested["status"] == "SUCCESS" and suggested["model"] == "sim"
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
        # ferry plan fit sweeps the Triton ferry up names in its state, not Ferry's own port
        assert (state / "triton-url").read_text().strip() == triton_server.grpc_url
        out = io.StringIO()
        with pytest.MonkeyPatch.context() as patch, redirect_stdout(out):
            patch.setenv("FERRY_STATE_DIR", str(state))
            assert main(["plan", "fit", "--model", "sim", "--batch-sizes", "1,2",
                         "--repeats", "1"]) == 0
        assert "from sweep" in out.getvalue()
        assert (state / "redis-url").read_text().strip() == redis_url
        assert (state / "redis.env").read_text().strip() == ""  # nothing but the URL to keep
        stop_and_check(proc, state)
    assert not (state / "triton-url").exists()  # stopped: nothing to sweep there any more
    assert not (state / "redis-url").exists() and not (state / "redis.env").exists()


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
    """A repository without ``moderation``: its first model is the default, and the banner's
    example is a request that model takes (here its tensors), never a 404."""
    repository = tmp_path / "models"
    shutil.copytree(bundled_repository() / "sim", repository / "sim",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repository / "mix" / "1").mkdir(parents=True)
    shutil.copy(STANDIN / "mix.py", repository / "mix" / "1" / "model.py")
    (repository / "mix" / "config.pbtxt").write_text(
        f'name: "mix"\nbackend: "python"\n{TENSOR_MODELS["mix"]}')
    state = tmp_path / "stack"
    with ferry_up("--model-repository", str(repository), state=state) as (proc, lines, base):
        banner = "".join(lines)
        assert "default model  mix" in banner and "moderation" not in banner, banner
        suggested = banner_request(lines, base)
        assert suggested["status"] == "SUCCESS" and suggested["model"] == "mix", suggested
        assert {o["name"] for o in suggested["output"]["outputs"]} == {"SCALED", "TOTAL"}
        with httpx.Client(base_url=base, timeout=30) as client:
            accepted = client.post("/v1/inference", json={"model": "sim", "input": "any model"})
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
