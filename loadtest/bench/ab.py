"""Interleaved A/B of two Ferry source trees on this machine: which one costs less per inference.

Both trees run in turn (gateway and batcher processes, ``PYTHONPATH`` set to the tree's
``services/``) against one tritonserver and one Redis, round after round, so that the machine's
drift hits both alike; each point reports medians over the rounds of p50, p99 and CPU per
inference, split by process. The fast sim backend (or the slow), the one-request flow (or
POST then GET, or ``--flow grpc``: Triton's gRPC ModelInfer at the gateway's gRPC port), loopback
only.

    git worktree add /tmp/before <commit>
    .venv/bin/python -m loadtest.bench.ab --a /tmp/before/services --b services \\
        --rates 400,1200 --rounds 3 --seconds 10

``--redis-masters 3`` runs both on a Redis Cluster of 3 masters on loopback instead.
``--env-b NAME=VALUE`` (and ``--env-a``) sets a ``FERRY_*`` variable for one side's gateway and
batcher: one tree against itself with a setting on and off, e.g. the inference log at 10%::

    .venv/bin/python -m loadtest.bench.ab --a services --b services --rates 50,400 \
        --env-b FERRY_LOG_MODELS=fast_1i=0.1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop

from ferry.settings import BatcherSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_ports, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_server import start_redis_servers
from ferry.stack.triton_server import start_triton
from loadtest.bench.backends import FAST, SLOW, Scenario, write_repository
from loadtest.bench.cpu import cpu_seconds, family
from loadtest.generator import run
from loadtest.gpukit.run import settings_env

Row = tuple[float, float, float, float, float, float]  # p50, p99, cpu, gateway, batcher, redis


FLOWS = ("ferry-1req", "ferry-2req", "grpc")
FLOW_HELP = ("one request per task (Prefer: wait), POST then GET ?wait=10, or Triton's gRPC "
             "ModelInfer at the gateway's gRPC port")


@dataclass
class Ferry:
    """One tree's gateway and batcher, started and ready."""

    procs: dict[str, ManagedProcess]
    url: str  # the gateway's HTTP port
    grpc: str  # its gRPC port, host:port

    def target(self, flow: str) -> tuple[str, str]:
        """The generator's flow and address for one of ``FLOWS``."""
        return ("triton", self.grpc) if flow == "grpc" else (flow, self.url)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop(grace_s=10)


def start_ferry(tree: str, state: Path, *, triton: str, triton_http: str, redis_url: str,
                model: str, flow: str, env: dict[str, str] | None = None) -> Ferry:
    """The tree's gateway and batcher (``env``: more settings for both, as FERRY_* variables),
    started, ready and warmed up through ``flow`` (one of ``FLOWS``)."""
    port, grpc_port = free_ports(2)
    gateway = GatewaySettings(redis_url=redis_url, triton_url=triton, port=port,
                              grpc_port=grpc_port, default_model=model)
    batcher = BatcherSettings(redis_url=redis_url, triton_url=triton, metrics_port=0,
                              triton_http_url=triton_http)
    extra = {"PYTHONPATH": tree, **(env or {})}
    procs = {name: ManagedProcess(name, [sys.executable, "-m", "ferry", name],
                                  env=env_with({**to_env(settings, type(settings)), **extra}),
                                  log_path=state / f"{name}.log")
             for name, settings in (("batcher", batcher), ("gateway", gateway))}
    for proc in procs.values():
        proc.start()
    ferry = Ferry(procs, f"http://{LOOPBACK}:{port}", f"{LOOPBACK}:{grpc_port}")
    try:
        procs["gateway"].wait_ready(lambda: http_ok(f"{ferry.url}/readyz"), 60)
        time.sleep(1.0)  # every gateway worker is up
        uvloop.run(run(*ferry.target(flow), model, 10, 10))  # warm up
    except BaseException:
        ferry.stop()
        raise
    return ferry


def measure(tree: str, state: Path, *, triton: str, triton_http: str, redis_url: str,  # noqa: PLR0913 - one bench round's knobs, keyword-only
            redis_pid: int | list[int], model: str, rates: list[float], seconds: float,
            seed: int, flow: str = "ferry-1req",
            env: dict[str, str] | None = None) -> dict[float, Row]:
    """One round of one tree: start its gateway and batcher, run each rate, stop them (``env``:
    more settings for both, as FERRY_* variables; ``redis_pid``: every Redis process whose CPU
    is Redis's, replicas included)."""
    ferry = start_ferry(tree, state, triton=triton, triton_http=triton_http,
                        redis_url=redis_url, model=model, flow=flow, env=env)
    generator_flow, target = ferry.target(flow)
    rows: dict[float, Row] = {}
    try:
        groups = {name: family(proc.pid or 0) for name, proc in ferry.procs.items()}
        groups["redis"] = redis_pid if isinstance(redis_pid, list) else [redis_pid]
        for rate in rates:
            before = {k: sum(cpu_seconds(p) for p in v) for k, v in groups.items()}
            count = int(rate * seconds)
            result = uvloop.run(run(generator_flow, target, model, rate, count, seed=seed))
            after = {k: sum(cpu_seconds(p) for p in v) for k, v in groups.items()}
            used = {k: (after[k] - before[k]) * 1e6 / count for k in before}
            rows[rate] = (result.p50_ms, result.p99_ms, sum(used.values()), used["gateway"],
                          used["batcher"], used["redis"])
    finally:
        ferry.stop()
    return rows


def start_redis_for(state: Path, masters: int) -> tuple[list[ManagedProcess], str, dict[str, str]]:
    """One Redis, or a Redis Cluster of ``masters``: its processes, its URL, and the settings
    that tell Ferry which."""
    procs, url = start_redis_servers(state / "redis", masters)
    return procs, url, {"FERRY_REDIS_CLUSTER": "true"} if masters > 1 else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the first tree's services/ directory")
    parser.add_argument("--b", required=True, help="the second tree's services/ directory")
    parser.add_argument("--rates", default="400,1200")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--backend", choices=("fast", "slow"), default="fast",
                        help="the simulated backend: fast (4 + 0.25 B ms) or slow (50 + 2 B ms)")
    parser.add_argument("--instances", type=int, default=1, help="its Triton instances")
    parser.add_argument("--infer-over", choices=("http", "grpc"), default="http",
                        help="the batcher's infer calls: over Triton's HTTP (as ferry up sets it; "
                             "a tree older than FERRY_TRITON_HTTP_URL ignores it) or gRPC")
    parser.add_argument("--flow", choices=FLOWS, default="ferry-1req", help=FLOW_HELP)
    parser.add_argument("--redis-masters", type=int, default=1,
                        help="one Redis (1), or a Redis Cluster of this many masters")
    for side in ("a", "b"):
        parser.add_argument(f"--env-{side}", action="append", default=[], metavar="NAME=VALUE",
                            help=f"a FERRY_* variable for {side}'s processes only (repeatable)")
    args = parser.parse_args()
    sides = {side: settings_env(given, f"--env-{side}")
             for side, given in (("a", args.env_a), ("b", args.env_b))}
    rates = [float(r) for r in args.rates.split(",")]
    trees = {"a": str(Path(args.a).resolve()), "b": str(Path(args.b).resolve())}
    state = Path(tempfile.mkdtemp(prefix="ferry-ab-"))
    scenario = Scenario(FAST if args.backend == "fast" else SLOW, args.instances)
    repository = write_repository(state / "models", [scenario], 50)
    triton, ports = start_triton(repository, state / "triton")
    redis_procs, redis_url, redis_env = start_redis_for(state, args.redis_masters)
    results: dict[tuple[str, float], list[Row]] = {}
    try:
        for round_ in range(args.rounds):
            order = list(trees.items())  # a first in even rounds, b first in odd: no order bias
            for name, tree in order if round_ % 2 == 0 else order[::-1]:
                rows = measure(tree, state, triton=f"{LOOPBACK}:{ports.grpc}",
                               triton_http=(f"{LOOPBACK}:{ports.http}"
                                            if args.infer_over == "http" else ""),
                               redis_url=redis_url,
                               redis_pid=[proc.pid or 0 for proc in redis_procs],
                               model=scenario.name, rates=rates, seconds=args.seconds,
                               seed=11 + round_, flow=args.flow,
                               env={**redis_env, **sides[name]})
                for rate, row in rows.items():
                    results.setdefault((name, rate), []).append(row)
    finally:
        for proc in redis_procs:
            proc.stop()
        triton.stop()
    for (name, rate), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = [statistics.median(r[i] for r in runs) for i in range(6)]
        given = "".join(f" {k}={v}" for k, v in sides[name].items())
        print(f"{rate:6.0f}/s {name} ({trees[name]}{given}): p50 {med[0]:6.2f} "
              f"p99 {med[1]:6.2f} ms  "
              f"cpu {med[2]:5.0f} us = gateway {med[3]:4.0f} + batcher {med[4]:4.0f} + "
              f"redis {med[5]:4.0f}")
        print(f"{'':8} rounds: p99 " + " ".join(f"{r[1]:.1f}" for r in runs)
              + " ms; cpu " + " ".join(f"{r[2]:.0f}" for r in runs) + " us")


if __name__ == "__main__":
    main()
