"""The kit's processes: Redis, Triton with the kit's repository, and Ferry sized for the machine.

Ferry runs as its chart runs it on one node: gateway processes sharing the ports, and batchers
that split the 16 partitions between them, infer calls over Triton's HTTP endpoint (as ``ferry
up`` sets it). Its result cache and request collapsing are off: every request of the load must
reach the GPU, as every request to Triton alone does, whatever inputs the load generator repeats.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ferry.settings import BatcherSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_server import start_redis_servers
from ferry.stack.triton_server import TritonPorts, start_triton
from loadtest.bench.cpu import family

PARTITIONS = 16
BATCHERS = 2  # by default, on any machine


@dataclass(frozen=True)
class Sizing:
    """How many of Ferry's processes run on the machine."""

    gateways: int
    batchers: int

    @classmethod
    def for_cores(cls, cores: int) -> Sizing:
        """On 16 cores 6 gateway processes, leaving Redis, Triton's model processes and the
        load generator cores of their own; on 2 cores one. Always 2 batchers: they share the
        model's instances through Redis (the fleet's shared budget), and the kit measures the
        batches they send beside Triton alone's."""
        if cores <= 4:
            return cls(gateways=1, batchers=BATCHERS)
        return cls(gateways=max(1, (cores * 3) // 8), batchers=BATCHERS)


def partition_ranges(batchers: int, partitions: int = PARTITIONS) -> list[str]:
    """``owned_partitions`` of each batcher: contiguous, as even as they divide."""
    bounds = [round(i * partitions / batchers) for i in range(batchers + 1)]
    return [f"{bounds[i]}-{bounds[i + 1] - 1}" for i in range(batchers)]


@dataclass
class KitStack:
    """Redis, Triton and Ferry, started in order and stopped in reverse."""

    state: Path
    repository: Path
    sizing: Sizing
    default_model: str
    redis_masters: int = 1  # more than one: a Redis Cluster of that many masters, no replicas
    settings: dict[str, str] = field(default_factory=dict)  # FERRY_* over the kit's own
    processes: list[ManagedProcess] = field(default_factory=list)
    triton_grpc: str = ""
    triton_http: str = ""
    gateway_grpc: str = ""
    gateway_http: str = ""
    redis_url: str = ""
    pids: dict[str, list[int]] = field(default_factory=dict)

    def start(self, triton_timeout_s: float = 240.0) -> None:
        triton, ports = _start_triton_clean(self.repository, self.state / "triton",
                                            triton_timeout_s)
        self.processes.append(triton)
        self.triton_grpc = f"{LOOPBACK}:{ports.grpc}"
        self.triton_http = f"{LOOPBACK}:{ports.http}"
        redis_procs, self.redis_url = start_redis_servers(self.state / "redis",
                                                          self.redis_masters)
        self.processes += redis_procs
        self.pids = {"triton": family(triton.pid or 0),
                     "redis": [proc.pid or 0 for proc in redis_procs]}
        self._start_ferry()

    def _start_ferry(self) -> None:
        port, grpc_port = free_port(), free_port()
        self.gateway_http, self.gateway_grpc = f"{LOOPBACK}:{port}", f"{LOOPBACK}:{grpc_port}"
        batchers = []
        for index, owned in enumerate(partition_ranges(self.sizing.batchers)):
            settings = BatcherSettings(redis_url=self.redis_url, redis_cluster=self.cluster,
                                       triton_url=self.triton_grpc,
                                       triton_http_url=self.triton_http,
                                       owned_partitions=owned, metrics_port=free_port())
            batchers.append(self._launch(f"batcher-{index}", "batcher",
                                         to_env(settings, BatcherSettings)))
        gateway = GatewaySettings(redis_url=self.redis_url, redis_cluster=self.cluster,
                                  triton_url=self.triton_grpc,
                                  port=port, grpc_port=grpc_port, workers=self.sizing.gateways,
                                  default_model=self.default_model, cache_ttl_s=0,
                                  collapse_requests=False)
        front = self._launch("gateway", "gateway", to_env(gateway, GatewaySettings))
        front.wait_ready(lambda: http_ok(f"http://{self.gateway_http}/readyz"), 120)
        time.sleep(1.0)  # every gateway process is up
        self.pids["gateway"] = family(front.pid or 0)
        self.pids["batchers"] = [p for b in batchers for p in family(b.pid or 0)]

    def _launch(self, name: str, command: str, env: dict[str, str]) -> ManagedProcess:
        proc = ManagedProcess(name, [sys.executable, "-m", "ferry", command],
                              env=env_with({**env, **self.settings}),
                              log_path=self.state / "logs" / f"{name}.log")
        proc.start()
        self.processes.append(proc)
        return proc

    @property
    def cluster(self) -> bool:
        return self.redis_masters > 1

    @property
    def ferry_pids(self) -> list[int]:
        return [*self.pids.get("gateway", []), *self.pids.get("batchers", []),
                *self.pids.get("redis", [])]

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop(grace_s=15)


def _start_triton_clean(repository: Path, state: Path,
                        timeout_s: float) -> tuple[ManagedProcess, TritonPorts]:
    """Triton without this process's PYTHONPATH: its model processes import the machine's own
    PyTorch, never the wheels the kit brought for Ferry (they find this interpreter's venv
    through PATH, scripts/gpu-kit.sh)."""
    saved = os.environ.pop("PYTHONPATH", None)
    try:
        return start_triton(repository, state, timeout_s=timeout_s)
    finally:
        if saved is not None:
            os.environ["PYTHONPATH"] = saved
