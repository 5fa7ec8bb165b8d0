"""A private redis-server on a loopback port."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
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
    interrupted: Callable[[], bool] = lambda: False,
) -> tuple[ManagedProcess, str]:
    """Start redis-server and wait until it accepts connections; returns it and its URL."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess(
        "redis-server", redis_argv(port, data_dir, persist=persist),
        log_path=data_dir / "redis.log",
    )
    proc.start()
    try:
        proc.wait_ready(lambda: answers_ping(port), timeout_s, interrupted)
    except StartupError:
        proc.stop(grace_s=5)
        raise
    return proc, f"redis://{LOOPBACK}:{port}/0"
