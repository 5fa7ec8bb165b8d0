"""The stack a soak watches, all real processes on loopback: a Redis master with two replicas
and three sentinels, one Triton serving the sim model, and gateways and batchers as separate
``ferry gateway`` / ``ferry batcher`` processes that find the master through the sentinels.
The bench's recovery part (``loadtest.bench.recovery``) runs the same stack with Ferry's own
settings, its own model, and (``sentinels=False``) one Redis with its append-only file, as
``ferry up`` runs it.

Every Ferry process and Triton is a :class:`Service`: a process with a liveness check that the
supervisor starts again when it has exited, as Kubernetes restarts a pod's container.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ferry.settings import BatcherSettings, CommonSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_ha import RedisNode, SentinelGroup, start_sentinel_group
from ferry.stack.triton_server import TritonPorts, http_ready, start_triton
from ferry.stack.up import bundled_repository
from loadtest.bench.cpu import family
from loadtest.soak.memory import family_rss_bytes, rss_bytes
from loadtest.soak.plan import Target

MODEL = "sim"
# With sentinels the URL's host and port are not used: only its database.
SENTINEL_URL = f"redis://{LOOPBACK}:6379/0"
# Records outlive the run and its final re-read (the default, 600 s, would not for long runs).
MIN_RESULT_TTL_S = 3600
# The soak's batchers: as the tests' helpers set them, and a killed batcher's tasks reclaimed
# within seconds (30 s by default), so that they end within the drain.
SOAK_BATCHER: dict[str, Any] = {"backoff_base_ms": 10.0, "backoff_max_ms": 50.0,
                                "claim_idle_ms": 5000, "claim_interval_ms": 1000}
AOF = ["--appendonly", "yes", "--appendfsync", "everysec"]  # as ferry up persists its Redis


@dataclass
class Service:
    """A supervised process: ``alive`` says it serves (not only that it runs)."""

    name: str
    target: Target
    process: ManagedProcess
    alive: Callable[[], bool]
    held: bool = False  # a fault is working on it: the supervisor leaves it alone
    restarts: int = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process.running() else None

    def ready(self) -> bool:
        return self.process.running() and not self.held and self.alive()


@dataclass
class SoakStack:
    state: Path
    gateways: int = 2
    batchers: int = 2
    result_ttl_s: int = MIN_RESULT_TTL_S
    # Redis's own guard against a master cut off from its replicas (0: off, as
    # ferry.stack.redis_ha starts it): such a master refuses writes (NOREPLICAS).
    min_replicas_to_write: int = 0
    redis_socket_timeout_s: float = 10.0  # FERRY_REDIS_SOCKET_TIMEOUT_S of Ferry's processes
    min_replicas: int = 1  # FERRY_REDIS_MIN_REPLICAS of Ferry's processes
    model: str = MODEL  # the model the gateways default to
    repository: Path | None = None  # Triton's models (None: the bundled sim model)
    sentinels: bool = True  # False: one redis-server with its append-only file, no replicas
    batcher_overrides: dict[str, Any] = field(default_factory=lambda: dict(SOAK_BATCHER))
    group: SentinelGroup | None = None
    redis: RedisNode | None = None  # the one Redis when there are no sentinels
    services: list[Service] = field(default_factory=list)
    gateway_ports: list[int] = field(default_factory=list)

    def start(self) -> None:
        """Start everything and return once every gateway is ready (blocking)."""
        try:
            self._start_redis()
            triton = self._start_triton()
            common = self._common(triton)
            for index in range(self.batchers):
                self._start_ferry(f"batcher-{index}", Target.BATCHER, self._batcher(common))
            for index in range(self.gateways):
                self._start_ferry(f"gateway-{index}", Target.GATEWAY, self._gateway(common))
            for service in self.of(Target.GATEWAY):
                port = self.gateway_ports[int(service.name.rsplit("-", 1)[1])]
                service.process.wait_ready(
                    functools.partial(http_ok, f"http://{LOOPBACK}:{port}/readyz"), 120)
        except BaseException:
            self.stop()
            raise

    def of(self, target: Target) -> list[Service]:
        return [s for s in self.services if s.target is target]

    def _start_redis(self) -> None:
        if not self.sentinels:
            self.redis = RedisNode(free_port(), self.state / "redis", list(AOF))
            self.redis.start()
            return
        self.group = start_sentinel_group(self.state / "redis")
        if self.min_replicas_to_write:
            guard_writes(self.group, self.min_replicas_to_write)

    def master_port(self) -> int | None:
        """The port of the Redis that takes writes now (None: the sentinels name none)."""
        if self.redis is not None:
            return self.redis.port
        return self.group.master_port() if self.group is not None else None

    def _start_triton(self) -> TritonPorts:
        repository = self.repository or self.state / "models"
        if not repository.exists():
            shutil.copytree(bundled_repository() / MODEL, repository / MODEL,
                            ignore=shutil.ignore_patterns("__pycache__"))
        process, ports = start_triton(repository, self.state / "triton", timeout_s=180)
        self.services.append(Service("triton", Target.TRITON, process,
                                     functools.partial(http_ready, ports.http)))
        return ports

    def _common(self, triton: TritonPorts) -> dict[str, Any]:
        if self.redis is not None:
            where: dict[str, Any] = {"redis_url": f"redis://{LOOPBACK}:{self.redis.port}/0"}
        else:
            assert self.group is not None
            where = {"redis_url": SENTINEL_URL, "redis_sentinels": self.group.sentinel_spec,
                     "redis_sentinel_master": self.group.name}
        return {**where, "redis_min_replicas": self.min_replicas,
                "redis_wait_ms": 500, "redis_socket_timeout_s": self.redis_socket_timeout_s,
                "triton_url": f"{LOOPBACK}:{triton.grpc}",
                "result_ttl_s": self.result_ttl_s, "log_level": "INFO",
                "triton_http_url": f"{LOOPBACK}:{triton.http}"}

    def _gateway(self, common: dict[str, Any]) -> GatewaySettings:
        port = free_port()
        self.gateway_ports.append(port)
        return GatewaySettings(
            **{k: v for k, v in common.items() if k != "triton_http_url"}, port=port,
            grpc_port=0, workers=1, default_model=self.model, jobs=False,
            job_store_dir=str(self.state / "jobs"))

    def _batcher(self, common: dict[str, Any]) -> BatcherSettings:
        return BatcherSettings(**common, metrics_port=free_port(), **self.batcher_overrides)

    def _start_ferry(self, name: str, target: Target, settings: CommonSettings) -> None:
        kind = GatewaySettings if target is Target.GATEWAY else BatcherSettings
        process = ManagedProcess(name, [sys.executable, "-m", "ferry", target.value],
                                 env=env_with(to_env(settings, kind)),
                                 log_path=self.state / "logs" / f"{name}.log")
        process.start()
        if isinstance(settings, GatewaySettings):
            url = f"http://{LOOPBACK}:{settings.port}/healthz"
        else:
            assert isinstance(settings, BatcherSettings)
            url = f"http://{LOOPBACK}:{settings.metrics_port}/healthz"
        self.services.append(Service(name, target, process, functools.partial(http_ok, url, 1.0)))

    def processes(self) -> dict[str, tuple[int, Callable[[], int | None]]]:
        """Every live process of the stack: label to (pid, how to read its RSS)."""
        found: dict[str, tuple[int, Callable[[], int | None]]] = {}
        for service in self.services:
            pid = service.process.pid
            if pid is None or not service.process.running():
                continue
            if service.target is Target.TRITON:  # with its Python backend's stub processes
                found[service.name] = (pid, functools.partial(triton_rss_bytes, pid))
            else:
                found[service.name] = (pid, functools.partial(rss_bytes, pid))
        found.update(self._redis_processes())
        return found

    def _redis_processes(self) -> dict[str, tuple[int, Callable[[], int | None]]]:
        found: dict[str, tuple[int, Callable[[], int | None]]] = {}
        if self.group is None:
            if self.redis is not None and self.redis.running and self.redis.process is not None \
                    and self.redis.process.pid is not None:
                pid = self.redis.process.pid
                found[f"redis-{self.redis.port}"] = (pid, functools.partial(rss_bytes, pid))
            return found
        named = [(f"redis-{n.port}", n.process) for n in self.group.nodes]
        named += [(f"sentinel-{port}", process) for port, process in
                  zip(self.group.sentinel_ports, self.group.sentinels, strict=True)]
        for label, process in named:
            if process is not None and process.running() and process.pid is not None:
                found[label] = (process.pid, functools.partial(rss_bytes, process.pid))
        return found

    def stop(self) -> None:
        """Stop everything (a stopped process is continued first, so that it can exit)."""
        for service in reversed(self.services):
            pid = service.process.pid
            if pid is not None and service.process.running():
                send_signal(pid, signal.SIGCONT)
            service.process.stop(grace_s=15)
        if self.redis is not None:
            self.redis.kill()
        if self.group is not None:
            for node in self.group.nodes:
                if node.process is not None and node.process.pid and node.running:
                    send_signal(node.process.pid, signal.SIGCONT)
            self.group.stop()


GUARD_MAX_LAG_S = 2  # a replica whose last acknowledgement is older does not count


def guard_writes(group: SentinelGroup, replicas: int) -> None:
    """``min-replicas-to-write`` on every node, now and whenever it is started again: a
    master with fewer replicas acknowledging within GUARD_MAX_LAG_S refuses writes."""
    settings = {"min-replicas-to-write": str(replicas),
                "min-replicas-max-lag": str(GUARD_MAX_LAG_S)}
    for node in group.nodes:
        client = redis.Redis(host=LOOPBACK, port=node.port, socket_timeout=5)
        try:
            for name, value in settings.items():
                client.config_set(name, value)
        finally:
            client.close()
        node.extra = [*node.extra, *(a for n, v in settings.items() for a in (f"--{n}", v))]


def triton_rss_bytes(pid: int) -> int | None:
    """Triton's RSS with its Python backend's stub processes (its children)."""
    return family_rss_bytes(family(pid))


def send_signal(pid: int, sig: int, *, group: bool = False) -> bool:
    """Signal ``pid`` (``group``: with every process of the group it leads, as a container's
    processes die together); False if it is gone."""
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True
