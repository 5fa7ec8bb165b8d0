"""A pool of Tritons: Ferry's batchers sharing every server's instances, against Triton alone
driven round robin by the same client.

Two tritonservers on loopback serve the slow simulated backend (t(B) = 50 + 2·B ms, one instance
each) twice: without Triton batching (Ferry's copy) and with Triton's dynamic batcher (Triton
alone's). For 1 and 2 servers and 1, 2 and 4 batchers, a fresh gateway process and that many
``ferry batcher`` processes, ``FERRY_TRITON_URL`` naming every server of the configuration,
serve 78% of the pool's capacity and then a light 50/s; Triton alone gets the same schedules,
each request sent straight to the next server in turn. Reported (``loadtest.bench.pool_report``)
per row: done share, goodput at the SLO, p50/p99 of both and their ratio, each server's share
of the calls and the mean batch, both from Triton's own statistics on each server.

    .venv/bin/python -m loadtest.bench --only pool    # about 8 minutes; that section
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import redis

from ferry.settings import BatcherSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_server import start_redis
from ferry.stack.triton_server import (
    TritonPorts,
    http_ready,
    prepare_backends,
    triton_argv,
    triton_env,
)
from loadtest.bench.backends import SLOW, Scenario, write_repository
from loadtest.bench.cpu import machine_busy_seconds
from loadtest.bench.goodput import replace_section, slo_ms
from loadtest.bench.pool_report import HEADING, Row, Side, capacity, cells, lines, method
from loadtest.bench.sweep import TritonCounts, TritonStats
from loadtest.flows import FerryFlow, Flow, TritonFlow
from loadtest.generator import drive, schedule
from loadtest.gpukit.stack import partition_ranges

log = logging.getLogger(__name__)

SCENARIO = Scenario(SLOW, 1)  # one instance on each server
MAX_WAIT_MS = 50.0  # Ferry's default
SHARE = 0.78  # of the pool's capacity
LIGHT_RATE = 50.0
WARM_SHARE = 0.3  # the warm-up's rate, of the capacity: the batchers measure the model
FERRY = SCENARIO.model("ferry-1req")  # no Triton batching: Ferry batches
TRITON = SCENARIO.model("triton-dyn0")  # Triton's dynamic batcher, queue delay 0
FAILURES = (OSError, ValueError, asyncio.IncompleteReadError)


@dataclass(frozen=True)
class Plan:
    """What a run measures, and for how long."""

    configs: tuple[tuple[int, int], ...] = tuple((s, b) for s in (1, 2) for b in (1, 2, 4))
    load_s: float = 20.0  # of load at SHARE of the capacity
    light_s: float = 20.0  # at LIGHT_RATE (a p99 of 1,000 answers, not 500)
    warm_s: float = 3.0  # through each fresh Ferry, not counted
    drain_s: float = 40.0  # the longest wait for the last answers

    @property
    def servers(self) -> int:
        return max(servers for servers, _ in self.configs)


QUICK = Plan(configs=((2, 2),), load_s=3.0, light_s=3.0, warm_s=1.0, drain_s=20.0)


# -- the servers ------------------------------------------------------------------------------


@dataclass
class Server:
    """One tritonserver of the pool."""

    name: str
    state: Path
    ports: TritonPorts = field(default_factory=TritonPorts.free)
    proc: ManagedProcess | None = None

    @property
    def grpc(self) -> str:
        return f"{LOOPBACK}:{self.ports.grpc}"

    @property
    def http(self) -> str:
        return f"{LOOPBACK}:{self.ports.http}"


@dataclass
class Backbone:
    """The tritonservers and Redis, for every run. Started from the event loop's (main) thread:
    a process's parent-death signal follows the thread that started it."""

    state: Path
    count: int
    servers: list[Server] = field(default_factory=list)
    processes: list[ManagedProcess] = field(default_factory=list)
    redis_url: str = ""

    def start(self) -> None:
        repository = write_repository(self.state / "models", [SCENARIO], MAX_WAIT_MS)
        shutil.rmtree(repository / SCENARIO.model("triton-dyn50"))  # not used: starts faster
        self.servers = [Server(name, self.state / name) for name in "ab"[:self.count]]
        for server in self.servers:  # every server starts at once
            server.proc = ManagedProcess(
                "tritonserver", triton_argv(repository, prepare_backends(server.state),
                                            server.ports),
                env=triton_env(), log_path=server.state / "triton.log")
            server.proc.start()
            self.processes.append(server.proc)
        for server in self.servers:
            assert server.proc is not None
            server.proc.wait_ready(partial(http_ready, server.ports.http), 300)
        redis_proc, self.redis_url = start_redis(self.state / "redis")
        self.processes.append(redis_proc)

    def flush(self) -> None:
        """A fresh Redis for each configuration (no lease, slot or report of the last)."""
        with redis.Redis.from_url(self.redis_url) as client:
            client.flushall()

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop(grace_s=20)


@contextlib.contextmanager
def ferry(backbone: Backbone, servers: Sequence[Server], batchers: int, folder: Path,
          log_level: str = "INFO") -> Iterator[int]:
    """A gateway process (a worker per core) and ``batchers`` batchers, the partitions split
    between them, every server of ``servers`` in their settings; yields the gateway's port once
    all are ready (``log_level``: the batchers', "INFO,ferry.batches=DEBUG" for a line per
    batch)."""
    grpc, http = ",".join(s.grpc for s in servers), ",".join(s.http for s in servers)
    port = free_port()
    gateway = GatewaySettings(redis_url=backbone.redis_url, triton_url=grpc, port=port,
                              grpc_port=0, default_model=FERRY, jobs=False,
                              job_store_dir=str(folder / "jobs"))
    settings: list[tuple[str, GatewaySettings | BatcherSettings]] = [
        (f"batcher-{index}", BatcherSettings(redis_url=backbone.redis_url, triton_url=grpc,
                                             triton_http_url=http, owned_partitions=owned,
                                             metrics_port=free_port(), log_level=log_level))
        for index, owned in enumerate(partition_ranges(batchers))]
    settings.append(("gateway", gateway))
    procs = [ManagedProcess(name, [sys.executable, "-m", "ferry", name.split("-")[0]],
                            env=env_with(to_env(s, type(s))), log_path=folder / f"{name}.log")
             for name, s in settings]
    try:
        for proc in procs:
            proc.start()
        for proc, (_, s) in zip(procs, settings, strict=True):
            where = s.port if isinstance(s, GatewaySettings) else s.metrics_port
            proc.wait_ready(partial(http_ok, f"http://{LOOPBACK}:{where}/readyz"), 90)
        time.sleep(1.0)  # every gateway worker is up
        yield port
    finally:
        for proc in reversed(procs):
            proc.stop(grace_s=20)


# -- the client -------------------------------------------------------------------------------


class RoundRobin:
    """Triton alone: each request straight to the next server, one inference each."""

    def __init__(self, servers: Sequence[Server]) -> None:
        self.flows = [TritonFlow(s.grpc, TRITON) for s in servers]

    async def __call__(self, index: int) -> str:
        return await self.flows[index % len(self.flows)](index)

    async def close(self) -> None:
        for flow in self.flows:
            await flow.close()


@dataclass
class Outcome:
    """What one open-loop run saw: each answered request's latency (ms from its scheduled
    send), every outcome counted, and the sends that left late."""

    sent: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    late: int = 0


async def drive_flow(flow: Flow, rate: float, seconds: float, *, seed: int,
                     drain_s: float) -> Outcome:
    """``flow`` open loop at ``rate`` (Poisson, drawn in advance) for ``seconds``; every
    request waited for until ``drain_s`` after the last send."""
    times = schedule(rate, max(1, round(rate * seconds)), seed=seed)
    outcome = Outcome(len(times), len(times) / rate)

    async def one(index: int, scheduled: float) -> None:
        try:
            seen = await flow(index)
        except FAILURES as exc:
            seen = type(exc).__name__
        outcome.outcomes[seen] += 1
        if seen == "SUCCESS":
            outcome.latencies_ms.append((time.perf_counter() - scheduled) * 1e3)

    try:
        tasks, outcome.late = await drive(times, time.perf_counter() + 0.05, one)
        _, unfinished = await asyncio.wait(tasks, timeout=drain_s)
        for task in unfinished:
            task.cancel()
        if unfinished:
            outcome.outcomes["TIMEOUT"] += len(unfinished)
    finally:
        await flow.close()
    return outcome


async def counted(stats: dict[str, TritonStats], model: str) -> dict[str, TritonCounts]:
    """Triton's counts of ``model`` on each server, so far."""
    return {name: await s.counts(model) for name, s in stats.items()}


async def side(system: str, flow: Flow, stats: dict[str, TritonStats], rate: float,
               seconds: float, *, seed: int, drain_s: float) -> Side:
    """One system's run, with Triton's counts on each server around it."""
    model = FERRY if system == "ferry" else TRITON
    before = await counted(stats, model)
    busy, started = machine_busy_seconds(), time.perf_counter()
    seen = await drive_flow(flow, rate, seconds, seed=seed, drain_s=drain_s)
    busy_cores = (machine_busy_seconds() - busy) / (time.perf_counter() - started)
    after = await counted(stats, model)
    ran = {name: after[name].minus(before[name]) for name in stats}
    return Side.measured(system, seen.latencies_ms, seen.sent, seen.seconds,
                         slo_ms(SCENARIO, MAX_WAIT_MS),
                         calls={n: c.executions for n, c in ran.items()},
                         inferences={n: c.inferences for n, c in ran.items()},
                         failures={k: v for k, v in seen.outcomes.items() if k != "SUCCESS"},
                         late_sends=seen.late, busy_cores=busy_cores)


# -- one configuration, then the next ---------------------------------------------------------


def rates(servers: int) -> list[tuple[str, float]]:
    """The rates each configuration runs: SHARE of the pool's capacity, then the light one."""
    top = float(round(SHARE * capacity(SCENARIO.backend, servers, SCENARIO.instances)))
    return [(f"{SHARE:.0%}", top), (f"{LIGHT_RATE:g}/s", LIGHT_RATE)]


@dataclass
class Runner:
    """Runs the plan's configurations on one backbone; ``rows`` as they are measured."""

    backbone: Backbone
    plan: Plan
    folder: Path
    stats: dict[str, TritonStats] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)

    async def warm_up(self) -> None:
        """A few calls to both models on each server (connections, the models' first calls)."""
        for server in self.backbone.servers:
            for model in (FERRY, TRITON):
                flow = TritonFlow(server.grpc, model)
                try:
                    await asyncio.gather(*(flow(i) for i in range(4)))
                finally:
                    await flow.close()

    async def config(self, servers: int, batchers: int) -> None:
        """Fresh Ferry processes on ``servers`` servers, warmed up, then each rate."""
        pool = self.backbone.servers[:servers]
        self.backbone.flush()
        with ferry(self.backbone, pool, batchers, self.folder / f"{servers}s-{batchers}b") as port:
            flow = partial(FerryFlow, LOOPBACK, port, FERRY, prefer_wait=True)
            top = capacity(SCENARIO.backend, servers, SCENARIO.instances)
            await drive_flow(flow(), round(WARM_SHARE * top), self.plan.warm_s, seed=1,
                             drain_s=self.plan.drain_s)
            for name, rate in rates(servers):
                row = await self.row(pool, batchers, name, rate, flow)
                self.rows.append(row)
                log.info("pool: %s", " | ".join(cells(row)))

    async def row(self, pool: Sequence[Server], batchers: int, name: str, rate: float,
                  ferry_flow: Callable[[], Flow]) -> Row:
        """Ferry and Triton alone at ``rate`` on the same schedule, one after the other (which
        goes first alternates from row to row: the machine's drift hits both alike)."""
        stats = {s.name: self.stats[s.name] for s in pool}
        seconds = self.plan.light_s if rate == LIGHT_RATE else self.plan.load_s
        seed = 200 + len(self.rows)
        order = ("ferry", "triton") if len(self.rows) % 2 == 0 else ("triton", "ferry")
        ran: dict[str, Side] = {}
        for system in order:
            client = ferry_flow() if system == "ferry" else RoundRobin(pool)
            ran[system] = await side(system, client, stats, rate, seconds, seed=seed,
                                     drain_s=self.plan.drain_s)
        return Row(len(pool), batchers, name, rate, ran["ferry"], ran["triton"], first=order[0])

    async def run(self) -> list[Row]:
        self.stats = {s.name: TritonStats(s.grpc) for s in self.backbone.servers}
        try:
            await self.warm_up()
            for servers, batchers in self.plan.configs:
                await self.config(servers, batchers)
        finally:
            for stats in self.stats.values():
                await stats.close()
        return self.rows


async def measure(folder: Path, plan: Plan) -> list[Row]:
    """Every configuration of ``plan`` in turn on one backbone."""
    backbone = Backbone(folder, plan.servers)
    try:
        backbone.start()  # here, not in a thread: see Backbone
        return await Runner(backbone, plan, folder).run()
    finally:
        backbone.stop()


async def write_section(out: Path, state: Path, quick: bool, command: str,
                        machine: str) -> list[Row]:
    """Measure (a --quick run: one configuration, briefly; not a measurement) and put the
    section in ``out``; the raw results in ``state``/pool/pool.json."""
    started = datetime.datetime.now(datetime.UTC)
    folder = state / "pool"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    plan = QUICK if quick else Plan()
    rows = await measure(folder, plan)
    (folder / "pool.json").write_text(json.dumps([r.to_json() for r in rows]))
    minutes = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
    how = method(SCENARIO.backend, SHARE, LIGHT_RATE, slo_ms(SCENARIO, MAX_WAIT_MS),
                 (plan.load_s, plan.light_s))
    note = (f"Measured by `{command}` on {started:%Y-%m-%d %H:%M} UTC in {minutes:.1f} minutes "
            f"({machine}). " + how)
    if quick:
        note = (f"A smoke run of `{command}` on {started:%Y-%m-%d %H:%M} UTC: one "
                f"configuration, {plan.load_s:g} s of load per run. **Not a measurement**: "
                "`python -m loadtest.bench --only pool` measures it.")
    text = out.read_text() if out.exists() else ""
    out.write_text(replace_section(text, lines(rows, note), HEADING))
    return rows
