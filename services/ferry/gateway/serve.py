"""Running the gateway: one uvicorn process, or one per core sharing the port."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import uvicorn

from ferry.errors import StartupError
from ferry.gateway.app import create_app
from ferry.gateway.timeouts import TimedHttpToolsProtocol
from ferry.settings import GatewaySettings, to_env
from ferry.stack.ports import is_listening
from ferry.telemetry.metrics import MULTIPROCESS_DIR


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota if any."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def server_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn's options for the gateway (its ``Config``'s keywords)."""
    return {"host": settings.host, "port": settings.port, "loop": "uvloop",
            # httptools, with the read timeouts the app's lifespan hands it (gateway/timeouts.py)
            "http": TimedHttpToolsProtocol, "ws": "none",
            "log_level": settings.log_levels.root.lower(),
            "access_log": settings.access_log,
            # open long-polls must not hold a stop for their whole ?wait=
            "timeout_graceful_shutdown": 3}


def serve(settings: GatewaySettings) -> int:
    """Serve until SIGINT/SIGTERM. Several workers rebuild the settings from ``FERRY_*``."""
    workers = settings.workers or available_cores()
    options = server_options(settings)
    if settings.grpc_port and is_listening(settings.host, settings.grpc_port):
        raise StartupError(f"port {settings.grpc_port} on {settings.host} is in use; pick "
                           "another with --grpc-port (0: no gRPC)")
    if workers == 1:
        uvicorn.run(create_app(settings), **options)
        return 0
    # Written, not read: the workers uvicorn starts rebuild the settings from these variables.
    os.environ.update(to_env(settings, GatewaySettings))
    metrics_dir = _fresh_metrics_dir()
    try:
        uvicorn.run("ferry.gateway.app:app_from_environment", factory=True, workers=workers,
                    **options)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _fresh_metrics_dir() -> str:
    """An empty directory for the workers' metric files (prometheus_client multiprocess mode)."""
    # prometheus_client's multiprocess directory, set (or chosen) here before the workers
    # start: the library itself reads the variable in every worker.
    chosen = os.environ.get(MULTIPROCESS_DIR)
    if chosen:
        shutil.rmtree(chosen, ignore_errors=True)
        os.makedirs(chosen, exist_ok=True)
    else:
        chosen = tempfile.mkdtemp(prefix="ferry-gateway-metrics-")
        os.environ[MULTIPROCESS_DIR] = chosen
    return chosen
