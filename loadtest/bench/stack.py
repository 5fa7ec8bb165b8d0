"""The processes a benchmark run measures: one Triton for every system, and Ferry in front of it.

Ferry runs as ``ferry up`` runs it (a gateway process per core, one batcher, a private Redis, infer
calls over the HTTP endpoint of the Triton it started), with its default settings, so the figures
are those of the default configuration.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

from ferry import keys
from ferry.settings import BatcherSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_server import start_redis
from ferry.stack.triton_server import TritonPorts, start_triton
from loadtest.bench.cpu import family


@dataclass
class BenchStack:
    """Triton (all models), Redis, a gateway and a batcher, started and stopped together."""

    state: Path
    repository: Path
    partitions: int = 16
    batcher_log_level: str = "INFO"  # "INFO,ferry.batches=DEBUG": a log line per batch
    batcher_settings: BatcherSettings | None = None
    gateway_overrides: dict[str, Any] = field(default_factory=dict)  # jobs' store, sources
    infer_over_http: bool = True  # the batcher's calls over Triton's HTTP, as ferry up (or gRPC)
    processes: list[ManagedProcess] = field(default_factory=list)
    triton_grpc: str = ""
    triton_http: str = ""
    triton_metrics: int = 0
    gateway_url: str = ""
    gateway_grpc: str = ""  # host:port of Triton's gRPC protocol on the gateway
    redis_url: str = ""
    pids: dict[str, list[int]] = field(default_factory=dict)

    def start(self, default_model: str) -> None:
        ports = TritonPorts.free()
        triton, ports = start_triton(self.repository, self.state / "triton", ports=ports,
                                     timeout_s=300)
        self.processes.append(triton)
        self.triton_grpc, self.triton_metrics = f"{LOOPBACK}:{ports.grpc}", ports.metrics
        self.triton_http = f"{LOOPBACK}:{ports.http}"
        redis_proc, self.redis_url = start_redis(self.state / "redis")
        self.processes.append(redis_proc)
        port = free_port()
        self.gateway_url = f"http://{LOOPBACK}:{port}"
        gateway = GatewaySettings(redis_url=self.redis_url, triton_url=self.triton_grpc,
                                  port=port, grpc_port=free_port(),
                                  default_model=default_model, **self.gateway_overrides)
        self.gateway_grpc = f"{LOOPBACK}:{gateway.grpc_port}"
        batcher = BatcherSettings(redis_url=self.redis_url, triton_url=self.triton_grpc,
                                  triton_http_url=self.triton_http if self.infer_over_http
                                  else "",
                                  metrics_port=free_port(), log_level=self.batcher_log_level)
        self.batcher_settings = batcher
        self.batcher_metrics = f"http://{LOOPBACK}:{batcher.metrics_port}/metrics"
        self._service("batcher", to_env(batcher, BatcherSettings))
        self._service("gateway", to_env(gateway, GatewaySettings))
        self.processes[-1].wait_ready(lambda: http_ok(f"{self.gateway_url}/readyz"), 120)
        time.sleep(1.0)  # every gateway worker is up
        self.pids = {name: family(proc.pid or 0) for name, proc in
                     (("triton", triton), ("redis", redis_proc), ("batcher", self.processes[-2]),
                      ("gateway", self.processes[-1]))}

    @property
    def gateway_http(self) -> str:
        """host:port of the gateway's HTTP (its /v1 API and Triton's REST protocol)."""
        return self.gateway_url.removeprefix("http://")

    def _service(self, name: str, env: dict[str, str]) -> None:
        self.processes.append(self._launch(name, env))

    def _launch(self, name: str, env: dict[str, str]) -> ManagedProcess:
        """``ferry <name>`` started with ``env``, its output in logs/<name>.log."""
        proc = ManagedProcess(name, [sys.executable, "-m", "ferry", name], env=env_with(env),
                              log_path=self.state / "logs" / f"{name}.log")
        proc.start()
        return proc

    def restart_batcher(self, **changes: Any) -> None:
        """Stop the batcher and start it again with ``changes`` to its settings (the goodput
        bench's ``slo_ms``, the jobs bench's ``max_batch``); it is back when its /readyz
        answers."""
        assert self.batcher_settings is not None, "start() first"
        index = next(i for i, p in enumerate(self.processes) if p.name == "batcher")
        self.processes[index].stop(grace_s=20)
        self.batcher_settings = replace(self.batcher_settings, **changes)
        proc = self._launch("batcher", to_env(self.batcher_settings, BatcherSettings))
        self.processes[index] = proc
        ready = self.batcher_metrics.removesuffix("/metrics") + "/readyz"
        proc.wait_ready(lambda: http_ok(ready), 60)
        self.pids["batcher"] = family(proc.pid or 0)

    def queue_depth(self) -> int:
        client = redis.Redis.from_url(self.redis_url)
        try:
            return sum(int(client.xlen(keys.partition_stream(p)))
                       for p in range(self.partitions))
        finally:
            client.close()

    def queue_state(self) -> dict[str, int]:
        """Entries in Ferry's streams (every priority), and those read but not acknowledged."""
        client = redis.Redis.from_url(self.redis_url)
        try:
            streams = [s for p in range(self.partitions) for s in keys.partition_streams(p)]
            queued = sum(int(client.xlen(s)) for s in streams)
            pending = 0
            for stream in streams:
                try:
                    pending += int(client.xpending(stream, keys.CONSUMER_GROUP)["pending"])
                except redis.ResponseError:  # no group on it yet
                    continue
            return {"queued": queued, "pending": pending}
        finally:
            client.close()

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until Ferry has no unfinished task (after a run that overloaded it)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.queue_depth() == 0:
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop(grace_s=20)
