"""One soak run: start the stack, measure or take the rate, load it while faults are injected
and crashed processes restarted, drain, read every task again, judge, report."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.generator import cpu_seconds
from loadtest.soak.client import Client, Gateways
from loadtest.soak.clock import Clock, wait_for_event
from loadtest.soak.config import SoakConfig
from loadtest.soak.diagnose import diagnose
from loadtest.soak.faults import FaultInjector
from loadtest.soak.ledger import Tracked, judge
from loadtest.soak.load import Load, calibrate
from loadtest.soak.memory import Sample, rss_bytes, sample, trends
from loadtest.soak.plan import fault_plan
from loadtest.soak.report import (
    latency_by_minute,
    memory_section,
    percentile,
    submissions,
    verdicts_section,
)
from loadtest.soak.stack import MIN_RESULT_TTL_S, SoakStack
from loadtest.soak.supervisor import Supervisor

log = logging.getLogger("loadtest.soak")
REREAD_CONCURRENCY = 32
REREAD_TRIES = 3
FAULTS_END_TIMEOUT_S = 120.0  # faults under way when the drain ends get this long to finish


@dataclass
class Sampler:
    """Every process's RSS every ``every_s`` (the soak's own too)."""

    stack: SoakStack
    clock: Clock
    every_s: float
    samples: list[Sample] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            processes = self.stack.processes()
            processes["soak"] = (os.getpid(), lambda: rss_bytes(os.getpid()))
            self.samples += await asyncio.to_thread(sample, self.clock.now(), processes)
            if await wait_for_event(stop, self.every_s):
                return


async def soak(config: SoakConfig) -> dict[str, Any]:
    """Run the soak ``config`` describes; its report."""
    state = config.state_dir or Path(tempfile.mkdtemp(prefix="ferry-soak-"))
    ttl = max(MIN_RESULT_TTL_S, int(config.duration_s + config.drain_s) + 600)
    stack = SoakStack(state, config.gateways, config.batchers, result_ttl_s=ttl,
                      min_replicas_to_write=config.min_replicas_to_write,
                      redis_socket_timeout_s=config.redis_socket_timeout_s,
                      min_replicas=config.min_replicas)
    log.info("starting the stack (logs in %s) ...", state / "logs")
    started = time.monotonic()
    await asyncio.to_thread(stack.start)
    startup_s = round(time.monotonic() - started, 1)
    log.info("stack up in %.1f s", startup_s)
    gateways = Gateways(stack.gateway_ports)
    cpu = cpu_seconds()
    try:
        report = await _run(config, stack, gateways)
    finally:
        await gateways.close()
        await asyncio.to_thread(stack.stop)
    report.update(state_dir=str(state), startup_s=startup_s, result_ttl_s=ttl,
                  client_cpu_s=round(cpu_seconds() - cpu, 1))
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    return report


async def _rate(config: SoakConfig, gateways: Gateways) -> tuple[float, float | None]:
    if config.rate is not None:
        return config.rate, None
    capacity = await calibrate(Client(gateways, Clock(), config.seed), Clock(),
                               config.calibrate_s)
    log.info("capacity %.1f tasks/s: load at %.0f%%", capacity, 100 * config.share)
    return max(1.0, config.share * capacity), round(capacity, 1)


@dataclass
class Session:
    """The parts of one run, for its report."""

    config: SoakConfig
    stack: SoakStack
    rate: float
    capacity: float | None
    clock: Clock
    client: Client
    load: Load
    injector: FaultInjector
    supervisor: Supervisor
    sampler: Sampler

    @classmethod
    def of(cls, config: SoakConfig, stack: SoakStack, gateways: Gateways, rate: float,
           capacity: float | None) -> Session:
        clock = Clock()
        client = Client(gateways, clock, config.seed)
        plan = fault_plan(config.seed, config.duration_s, config.fault_every_s,
                          kinds=config.faults)
        return cls(config, stack, rate, capacity, clock, client, Load(client, clock),
                   FaultInjector(stack, plan, clock, config.seed, config.redis_stop_s),
                   Supervisor(stack.services, clock),
                   Sampler(stack, clock, config.memory_every_s))


async def _run(config: SoakConfig, stack: SoakStack, gateways: Gateways) -> dict[str, Any]:
    rate, capacity = await _rate(config, gateways)
    run = Session.of(config, stack, gateways, rate, capacity)
    stop = asyncio.Event()
    background = [asyncio.create_task(run.supervisor.run(stop)),
                  asyncio.create_task(run.sampler.run(stop))]
    faults = asyncio.create_task(run.injector.run())
    log.info("load at %.1f/s for %g s, %d faults planned", rate, config.duration_s,
             len(run.injector.plan))
    try:
        await run.load.run(rate, config.duration_s, config.drain_s, config.seed)
        log.info("[%7.2fs] load and drain over; waiting for faults under way", run.clock.now())
        await asyncio.wait([faults], timeout=FAULTS_END_TIMEOUT_S)
        await reread(run.client, run.load.tasks)
    finally:
        faults.cancel()
        stop.set()
        await asyncio.gather(faults, *background, return_exceptions=True)
    return await _report(run)


async def reread(client: Client, tasks: list[Tracked]) -> None:
    """Read every accepted task's record once more, after the drain."""
    limit = asyncio.Semaphore(REREAD_CONCURRENCY)

    async def one(task: Tracked) -> None:
        assert task.task_id is not None
        async with limit:
            for attempt in range(REREAD_TRIES):
                gateway = attempt % len(client.gateways)
                record, seen = await client.read(task.task_id, gateway)
                task.reread, task.reread_status = record, "200" if record else seen
                if record is not None:
                    return

    await asyncio.gather(*(one(t) for t in tasks if t.task_id is not None))


async def _report(run: Session) -> dict[str, Any]:
    config, tasks, events = run.config, run.load.tasks, run.injector.events
    verdicts = judge(tasks)
    lost = await asyncio.to_thread(diagnose, run.stack.group, verdicts.lost, events)
    latencies = [t.latency_s * 1000 for t in tasks if t.latency_s is not None]
    injected = [e for e in events if e.at_s is not None and "skipped" not in e.details]
    return {
        "ok": not verdicts.lost and not verdicts.wrong,
        "seed": config.seed, "duration_s": config.duration_s, "rate": round(run.rate, 2),
        "capacity": run.capacity, "share": config.share if run.capacity else None,
        "fault_every_s": config.fault_every_s, "drain_s": config.drain_s,
        "redis_min_replicas_to_write": config.min_replicas_to_write,
        "redis_stop_s": config.redis_stop_s,
        "redis_socket_timeout_s": config.redis_socket_timeout_s,
        "ferry_min_replicas": config.min_replicas,
        "submissions": submissions(tasks, run.client.retries, run.client.refused,
                                   run.load.skipped),
        "results": verdicts_section(verdicts), "lost_tasks": lost,
        "faults": [asdict(e) for e in events],
        "fault_counts": dict(Counter(e.kind for e in injected)),
        "restarts": [asdict(r) for r in run.supervisor.restarts],
        "restart_counts": dict(Counter(r.name for r in run.supervisor.restarts)),
        "latency": {"p50_ms": _ms(percentile(latencies, 50)),
                    "p99_ms": _ms(percentile(latencies, 99))},
        "latency_per_minute": latency_by_minute(tasks),
        "memory": memory_section(run.sampler.samples,
                                 trends(run.sampler.samples, config.warmup_s)),
    }


def _ms(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 1)
