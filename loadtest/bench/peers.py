"""Ferry's Python peers (``loadtest/peers``) as the benchmark runs them: one at a time, each
started in front of the bench's Triton for one scenario's model, measured, and stopped (with its
whole process tree: Ray's daemons, BentoML's and LitServe's workers), so that an idle peer never
takes CPU from the system being measured.

    .venv/bin/python -m loadtest.bench.peers --peer litserve --rate 200 --count 1000

starts a Triton serving the fast backend, the peer in front of it, and drives it with the
generator's ``peer`` flow (a smoke run; ``make bench`` runs every peer beside Ferry).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.triton_server import TritonPorts, start_triton
from loadtest.bench.backends import FAST, Scenario, write_repository
from loadtest.bench.cpu import family
from loadtest.flows import PEER_PATH
from loadtest.generator import run

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".tools" / "peers" / "bin" / "python"  # make peers: the bench extra's venv
# The system names in the report, and the module each runs.
MODULES = {"ray-serve": "loadtest.peers.ray_serve",
           "bentoml": "loadtest.peers.bentoml_service",
           "litserve": "loadtest.peers.litserve_service"}
PEERS = tuple(MODULES)
# What marks a process that holds batches (in /proc/<pid>/cmdline), for the fault row's kill.
WORKER_MARKS = {"ray-serve": "ServeReplica",  # ray::ServeReplica:<app>:<deployment>
                "bentoml": "_bentoml_impl.worker.service",  # python -m ... --worker-id <n>
                "litserve": "spawn_main"}  # its inference workers (multiprocessing spawn)
START_S = 180.0  # Ray starts a cluster: tens of seconds on two busy cores
# After every worker's process exists: its imports and Triton client; Ray Serve's HAProxy reloads
# as each replica joins.
WORKER_START_S = 5.0


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "gone"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def workers(peer: Peer) -> list[int]:
    """The peer's processes that hold batches (its workers, replicas), oldest first."""
    return sorted(pid for pid in peer.pids if WORKER_MARKS[peer.name] in cmdline(pid))


def installed() -> bool:
    return PYTHON.exists()


def answers(url: str, timeout_s: float = 5.0) -> bool:
    """Whether the peer answers a prediction (Triton reached, the batch path warm)."""
    body = json.dumps({"input": "ready?"}).encode()
    request = urllib.request.Request(url + PEER_PATH, data=body, method="POST",  # noqa: S310
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return int(response.status) == 200 and "sha256" in json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class Peer:
    """One peer serving one model, started and stopped with its whole process tree."""

    name: str
    state: Path
    triton_grpc: str
    model: str
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # as Ferry's gateway
    max_batch: int = 64
    max_wait_ms: float = 50.0
    url: str = ""
    process: ManagedProcess | None = None

    def start(self) -> None:
        port = free_port()
        self.url = f"http://{LOOPBACK}:{port}"
        argv = [str(PYTHON), "-m", MODULES[self.name], "--port", str(port),
                "--triton", self.triton_grpc, "--model", self.model,
                "--workers", str(self.workers), "--max-batch", str(self.max_batch),
                "--max-wait-ms", f"{self.max_wait_ms:g}"]
        env = env_with({"PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
                        "BENTOML_DO_NOT_TRACK": "True", "DO_NOT_TRACK": "1"})
        self.process = ManagedProcess(self.name, argv, env=env, cwd=ROOT,
                                      log_path=self.state / "logs" / f"{self.name}.log")
        self.process.start()
        self.process.wait_ready(lambda: answers(self.url), START_S)
        # One worker answering is not all of them: each must be up before a run measures.
        self.process.wait_ready(lambda: len(workers(self)) >= self.workers, START_S)
        time.sleep(WORKER_START_S)

    @property
    def pids(self) -> list[int]:
        """The peer's processes now (its workers are restarted under it after a kill)."""
        return family(self.process.pid or 0) if self.process else []

    def groups(self, prefix: str) -> dict[str, list[int]]:
        """The peer's processes to meter: ``prefix`` for the whole tree, and ``prefix/<name>``
        for each kind of process in it (its name as the kernel has it: ``raylet``,
        ``ray::ServeRepli``...)."""
        tree = self.pids
        found: dict[str, list[int]] = {prefix: tree}
        for pid in tree:
            found.setdefault(f"{prefix}/{process_name(pid)}", []).append(pid)
        return found

    def stop(self) -> None:
        """SIGTERM to the peer's process group, then SIGKILL to whatever of its tree is left."""
        if self.process is None or self.process.pid is None:  # never started: nothing to stop
            return
        tree = self.pids
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.stop(grace_s=20)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process = None


def smoke(peer: str, rate: float, count: int, state: Path) -> dict[str, object]:
    """Triton (fast backend, one instance), the peer in front of it, one open-loop run."""
    scenario = Scenario(FAST, 1)
    repository = write_repository(state / "models", [scenario], 50.0)
    triton, ports = start_triton(repository, state / "triton", ports=TritonPorts.free(),
                                 timeout_s=300)
    service = Peer(peer, state, f"{LOOPBACK}:{ports.grpc}", scenario.name)
    try:
        started = time.monotonic()
        service.start()
        log.info("%s answered after %.1f s; %d processes", peer, time.monotonic() - started,
                 len(service.pids))
        result = uvloop.run(run("peer", service.url, scenario.name, rate, count, drain_s=30))
        return {k: v for k, v in result.to_json().items() if k != "histogram"}
    finally:
        service.stop()
        triton.stop(grace_s=20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=PEERS, required=True)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--state", default=str(ROOT / ".bench" / "peer-smoke"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    print(json.dumps(smoke(args.peer, args.rate, args.count, Path(args.state).resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
