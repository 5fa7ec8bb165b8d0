"""A private redis-server on a loopback port."""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ferry.errors import StartupError
from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.process import ManagedProcess


def answers_ping(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    """Whether Redis answers PING with PONG: it accepts connections while it is still loading
    its data, and answers every command with LOADING until it is done."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_argv(port: int, data_dir: Path, *, persist: bool) -> list[str]:
    """Arguments for a loopback-only redis-server; ``persist`` turns on the append-only file."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StartupError("redis-server not found on PATH (Debian: apt-get install redis-server)")
    argv = [binary, "--bind", LOOPBACK, "--port", str(port), "--dir", str(data_dir),
            "--save", "", "--protected-mode", "yes", "--loglevel", "warning"]
    if persist:
        argv += ["--appendonly", "yes", "--appendfsync", "everysec"]
    else:
        argv += ["--appendonly", "no"]
    return argv


def start_redis(
    data_dir: Path, *, port: int | None = None, persist: bool = False, timeout_s: float = 120.0,
    interrupted: Callable[[], bool] = lambda: False, extra: Sequence[str] = (),
) -> tuple[ManagedProcess, str]:
    """Start redis-server (``extra``: more of its arguments) and wait until it accepts
    connections; returns it and its URL."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess(
        "redis-server", [*redis_argv(port, data_dir, persist=persist), *extra],
        log_path=data_dir / "redis.log",
    )
    proc.start()
    try:
        proc.wait_ready(lambda: answers_ping(port), timeout_s, interrupted)
    except StartupError:
        proc.stop(grace_s=5)
        raise
    return proc, f"redis://{LOOPBACK}:{port}/0"


def start_redis_servers(data_dir: Path, masters: int = 1) -> tuple[list[ManagedProcess], str]:
    """One redis-server (``masters`` 1), or a Redis Cluster of ``masters``: its processes and
    the URL of one."""
    if masters > 1:
        return start_redis_cluster(data_dir, masters=masters)
    proc, url = start_redis(data_dir)
    return [proc], url


def start_redis_cluster(
    data_dir: Path, *, masters: int = 3, timeout_s: float = 60.0,
) -> tuple[list[ManagedProcess], str]:
    """A Redis Cluster of ``masters`` loopback redis-servers (no replicas), created with
    ``redis-cli --cluster create``; returns them and the URL of the first (a seed node)."""
    procs: list[ManagedProcess] = []
    ports: list[int] = []
    try:
        for index in range(masters):
            port = free_port()
            node_dir = data_dir / f"node{index}"
            node_dir.mkdir(parents=True, exist_ok=True)
            argv = [*redis_argv(port, node_dir, persist=False), "--cluster-enabled", "yes",
                    "--cluster-config-file", str(node_dir / "nodes.conf"),
                    "--cluster-node-timeout", "5000",
                    "--cluster-port", str(free_port())]  # else port + 10000, maybe taken
            proc = ManagedProcess(f"redis-cluster-{index}", argv,
                                  log_path=node_dir / "redis.log")
            procs.append(proc)
            proc.start()
            proc.wait_ready(functools.partial(answers_ping, port), timeout_s)
            ports.append(port)
        create_cluster(ports, timeout_s)
    except BaseException:
        for proc in procs:
            proc.stop(grace_s=5)
        raise
    return procs, f"redis://{LOOPBACK}:{ports[0]}/0"


def create_cluster(ports: list[int], timeout_s: float, replicas: int = 0) -> None:
    """Join loopback nodes into one cluster (slots spread evenly, ``replicas`` replicas per
    master) and wait for ``cluster_state:ok`` on every node."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise StartupError("redis-cli not found on PATH (Debian: apt-get install redis-tools)")
    created = subprocess.run(  # noqa: S603 - argv is built by Ferry, never a shell
        [cli, "--cluster", "create", *(f"{LOOPBACK}:{p}" for p in ports),
         "--cluster-replicas", str(replicas), "--cluster-yes"],
        capture_output=True, text=True, timeout=timeout_s, check=False)
    if created.returncode != 0:
        raise StartupError(f"redis-cli --cluster create failed: {created.stdout[-500:]}"
                           f"{created.stderr[-500:]}")
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while b"cluster_state:ok" not in _cluster_info(cli, port):
            if time.monotonic() > deadline:
                raise StartupError(f"the Redis Cluster on port {port} did not become ready")
            time.sleep(0.1)


def _cluster_info(cli: str, port: int) -> bytes:
    done = subprocess.run(  # noqa: S603 - argv is built by Ferry, never a shell
        [cli, "-h", LOOPBACK, "-p", str(port), "cluster", "info"], capture_output=True,
        timeout=10, check=False)
    return done.stdout
