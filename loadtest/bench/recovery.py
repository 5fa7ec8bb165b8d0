"""Recovery: what each fault costs under load, and how long until Ferry is back to normal.

Each fault hits a whole stack of real processes on loopback (``loadtest.soak.stack``, with
Ferry's default settings and the slow simulated backend) under open-loop load of ``Prefer:
wait`` requests (``loadtest.soak``'s client, which retries with the same Idempotency-Key at the
next gateway): a batcher killed (SIGKILL) or stopped (SIGTERM), not restarted, or paused
(SIGSTOP) past its lease; a gateway process killed and started again; Triton killed and started
again; Redis killed and started again from its append-only file, or paused past the lease; the
Redis master killed under Sentinel. Reported per fault
(``loadtest.bench.recovery_report``): requests accepted, lost, answered wrongly, what the
clients saw, the latency around the fault, and the recovery time.

    .venv/bin/python -m loadtest.bench --only recovery    # about 5 minutes; that section
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import shutil
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ferry import keys
from ferry.stack.ports import LOOPBACK
from loadtest.bench.backends import SLOW, Scenario, write_repository
from loadtest.bench.cpu import family
from loadtest.bench.goodput import replace_section
from loadtest.bench.recovery_report import (
    HEADING,
    FaultResult,
    Injected,
    lines,
    method,
    result_of,
    taken_over,
)
from loadtest.soak.client import Client, Gateways
from loadtest.soak.clock import Clock
from loadtest.soak.load import Load
from loadtest.soak.plan import Target
from loadtest.soak.run import reread
from loadtest.soak.stack import Service, SoakStack, send_signal

log = logging.getLogger(__name__)

SCENARIO = Scenario(SLOW, 1)
SHARE = 0.4  # of the slow backend's batched capacity (1 instance): 144/s
PREFER_WAIT_S = 20
PARTITIONS = 16  # Ferry's default
RESTART_TIMEOUT_S = 90.0
IDLE_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Timing:
    before_s: float = 4.0  # load before the fault
    after_s: float = 12.0  # and after it
    drain_s: float = 60.0  # the longest wait for the last answers


QUICK = Timing(before_s=3.0, after_s=4.0, drain_s=30.0)

Inject = Callable[[SoakStack], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # in words, for the report
    inject: Inject
    sentinels: bool = False  # on the Sentinel stack (else one Redis with its AOF)
    on_a_batcher: bool = False  # hits a batcher (else a takeover by lease took a live one's)


# -- the faults -------------------------------------------------------------------------------


def start_again(service: Service, timeout_s: float = RESTART_TIMEOUT_S) -> float | None:
    """Start an exited (or killed) service again: seconds until it is ready (None: not in
    time)."""
    started = time.monotonic()
    service.process.stop(grace_s=30.0)  # reaps it; one stopping on its own finishes first
    service.process.start()
    while time.monotonic() - started < timeout_s:
        if service.ready():
            return round(time.monotonic() - started, 2)
        time.sleep(0.1)
    return None


def signal_first(target: Target, sig: int, *, restart: bool, children: bool = False) -> Inject:
    """``sig`` to the first service of ``target`` (and to its children, as the end of its
    container would: Triton's Python backend stubs, else left running); started again at once
    if ``restart``."""
    async def inject(stack: SoakStack) -> dict[str, Any]:
        service = stack.of(target)[0]
        details: dict[str, Any] = {"pid": service.pid}
        tree = family(service.pid) if service.pid is not None and children else []
        if service.pid is None or not send_signal(service.pid, sig):
            return {"skipped": f"{service.name} was not running"}
        for pid in tree[1:]:
            send_signal(pid, sig)
        if restart:
            details["back_after_s"] = await asyncio.to_thread(start_again, service)
        return details
    return inject


PAUSE_S = 3.0  # longer than the lease (FERRY_LEASE_MS, 2 s)


async def paused(pid: int | None, seconds: float = PAUSE_S) -> dict[str, Any]:
    """SIGSTOP, ``seconds``, SIGCONT (always, even if cancelled): a stalled process."""
    if pid is None or not send_signal(pid, signal.SIGSTOP):
        return {"skipped": "it was not running"}
    try:
        await asyncio.sleep(seconds)
    finally:
        send_signal(pid, signal.SIGCONT)
    return {"paused_s": seconds}


async def pause_batcher(stack: SoakStack) -> dict[str, Any]:
    """The first batcher stalled past its lease (a VM pause, a GC pause), then resumed."""
    return await paused(stack.of(Target.BATCHER)[0].pid)


async def pause_redis(stack: SoakStack) -> dict[str, Any]:
    """The one Redis stalled past the lease, then resumed."""
    assert stack.redis is not None and stack.redis.process is not None
    return await paused(stack.redis.process.pid)


async def restart_redis(stack: SoakStack) -> dict[str, Any]:
    """kill -9 of the one Redis, started again at once on its port from its append-only
    file."""
    node = stack.redis
    assert node is not None, "a stack without sentinels"

    def restart() -> float:
        started = time.monotonic()
        node.kill(signal.SIGKILL)
        node.start()
        return round(time.monotonic() - started, 2)
    return {"back_after_s": await asyncio.to_thread(restart)}


async def failover(stack: SoakStack) -> dict[str, Any]:
    """kill -9 of the master the sentinels name; once they promoted a replica, the old master
    started again as its replica."""
    group = stack.group
    assert group is not None, "a stack with sentinels"

    def kill() -> dict[str, Any]:
        old = group.master()
        started = time.monotonic()
        old.kill(signal.SIGKILL)
        group.wait_failover(old.port, FAILOVER_TIMEOUT_S)
        promoted = round(time.monotonic() - started, 2)
        group.restart(old)
        group.wait_replica(old)
        return {"promoted_after_s": promoted,
                "old_master_in_sync_after_s": round(time.monotonic() - started, 2)}
    return await asyncio.to_thread(kill)


FAULTS = (
    Fault("kill-batcher", "batcher kill -9 (one of two, not restarted)",
          signal_first(Target.BATCHER, signal.SIGKILL, restart=False), on_a_batcher=True),
    Fault("term-batcher", "batcher SIGTERM (one of two, not restarted)",
          signal_first(Target.BATCHER, signal.SIGTERM, restart=False), on_a_batcher=True),
    Fault("stop-batcher", "batcher paused 3 s (SIGSTOP, past its lease), then resumed",
          pause_batcher, on_a_batcher=True),
    Fault("kill-gateway", "gateway kill -9 (one of two processes, started again at once)",
          signal_first(Target.GATEWAY, signal.SIGKILL, restart=True)),
    Fault("kill-triton", "Triton kill -9 (with its backend stubs), started again at once",
          signal_first(Target.TRITON, signal.SIGKILL, restart=True, children=True)),
    Fault("restart-redis", "Redis kill -9, started again at once (AOF, fsync every second)",
          restart_redis),
    Fault("stop-redis", "Redis paused 3 s (SIGSTOP, past the lease), then resumed",
          pause_redis),
    Fault("failover", "Redis master kill -9: Sentinel failover (FERRY_REDIS_MIN_REPLICAS=1)",
          failover, sentinels=True),
)


# -- what Redis holds -------------------------------------------------------------------------


def _client(stack: SoakStack) -> redis.Redis:
    port = stack.master_port()
    if port is None:
        raise redis.ConnectionError("the sentinels name no master")
    return redis.Redis(host=LOOPBACK, port=port, socket_timeout=0.5, socket_connect_timeout=0.5)


def queue_depth(stack: SoakStack) -> int:
    """The tasks in Ferry's streams (every partition and priority): admitted, not finished."""
    with _client(stack) as client:
        pipe = client.pipeline(transaction=False)
        for partition in range(PARTITIONS):
            for stream in keys.partition_streams(partition):
                pipe.xlen(stream)
        return sum(int(n) for n in pipe.execute())


def task_records(stack: SoakStack) -> int | None:
    """How many task records Redis holds (None: it did not answer)."""
    try:
        with _client(stack) as client:
            return sum(sum(1 for _ in client.scan_iter(keys.task_key_prefix(p) + "*",
                                                       count=1000))
                       for p in range(PARTITIONS))
    except redis.RedisError:
        return None


class DepthSampler:
    """Ferry's queue depth every ``period_s`` on the load's clock (no sample while Redis does
    not answer)."""

    def __init__(self, stack: SoakStack, clock: Clock, period_s: float = 0.1) -> None:
        self.stack, self.clock, self.period_s = stack, clock, period_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                depth = queue_depth(self.stack)
            except (redis.RedisError, OSError):
                continue
            self.samples.append((round(self.clock.now(), 3), float(depth)))

    @contextmanager
    def running(self) -> Iterator[DepthSampler]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=5)


# -- one fault, then the next -----------------------------------------------------------------


async def at_time(fault: Fault, stack: SoakStack, clock: Clock, at_s: float) -> Injected:
    """``fault`` at ``at_s`` on the load's clock; when it hit and what it did."""
    await clock.sleep_until(at_s)
    at, wall = round(clock.now(), 3), time.time()
    details = await fault.inject(stack)
    log.info("fault %s at %.2f s: %s", fault.name, at, details)
    return Injected(at, wall, details)


async def measure(stack: SoakStack, fault: Fault, rate: float, timing: Timing, seed: int, *,
                  measured: bool = True) -> FaultResult:
    """One fault under load, on a stack at rest; every record read again at the end."""
    records = await asyncio.to_thread(task_records, stack)
    gateways = Gateways(stack.gateway_ports)
    clock = Clock()
    client = Client(gateways, clock, seed, prefer_wait_s=PREFER_WAIT_S, model=SCENARIO.name)
    load, sampler = Load(client, clock), DepthSampler(stack, clock)
    hit = asyncio.create_task(at_time(fault, stack, clock, timing.before_s))
    try:
        with sampler.running():
            await load.run(rate, timing.before_s + timing.after_s, timing.drain_s, seed)
            injected = await hit
            await asyncio.sleep(1.5)  # the depth sampled past the last answer (HOLD_S)
        await reread(client, load.tasks)
    finally:
        hit.cancel()
        await gateways.close()
    after = await asyncio.to_thread(task_records, stack)
    created = None if records is None or after is None else after - records
    logs = [path.read_text(errors="replace") for path in
            (stack.state / "logs" / f"{b.name}.log" for b in stack.of(Target.BATCHER))
            if path.exists()]
    injected.details.update(taken_over(logs, injected.wall))
    if "taken_over_tasks" in injected.details and not fault.on_a_batcher:
        injected.details["live"] = True
    return result_of(load.tasks, injected, sampler.samples, fault=fault.name, what=fault.what,
                     rate=rate, gave_up=sum(client.refused.values()), created=created,
                     measured=measured)


def restore(stack: SoakStack) -> None:
    """Every service running and ready again, and no task left in Ferry's streams."""
    for service in stack.services:
        if not service.ready():
            back = start_again(service)
            log.info("%s started again: ready after %s s", service.name, back)
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if queue_depth(stack) == 0:
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.2)
    log.warning("Ferry's streams still hold tasks after %g s", IDLE_TIMEOUT_S)


def models(folder: Path) -> Path:
    """A repository with the slow backend's model alone (Triton starts faster without the
    variants the sweep needs)."""
    repository = write_repository(folder / "models", [SCENARIO], 50.0)
    for variant in ("triton-dyn0", "triton-dyn50"):
        shutil.rmtree(repository / SCENARIO.model(variant))
    return repository


def stack_for(folder: Path, repository: Path, *, sentinels: bool) -> SoakStack:
    """Two gateway processes, two batchers and Triton with Ferry's default settings; one Redis
    with its AOF, or a Sentinel group with FERRY_REDIS_MIN_REPLICAS=1 (docs/redis.md)."""
    return SoakStack(folder / ("sentinel" if sentinels else "single"), gateways=2, batchers=2,
                     min_replicas=1 if sentinels else 0, model=SCENARIO.name,
                     repository=repository, sentinels=sentinels, batcher_overrides={})


async def run_faults(folder: Path, faults: tuple[Fault, ...], timing: Timing, *,
                     measured: bool = True) -> list[FaultResult]:
    """Every fault in turn, those of each kind of stack on one such stack."""
    repository = models(folder)
    rate = float(round(SHARE * SCENARIO.backend.batched_capacity(SCENARIO.instances)))
    results: list[FaultResult] = []
    for sentinels in (False, True):
        chosen = [f for f in faults if f.sentinels is sentinels]
        if not chosen:
            continue
        stack = stack_for(folder, repository, sentinels=sentinels)
        await asyncio.to_thread(stack.start)
        try:
            for index, fault in enumerate(chosen):
                await asyncio.to_thread(restore, stack)
                result = await measure(stack, fault, rate, timing, seed=71 + index,
                                       measured=measured)
                log.info("%s: %d accepted, %d lost, recovery %s s", fault.name,
                         result.accepted, result.lost, result.recovery_s)
                results.append(result)
        finally:
            await asyncio.to_thread(stack.stop)
    return results


async def write_section(out: Path, state: Path, quick: bool, command: str,
                        machine: str) -> list[FaultResult]:
    """Measure (a --quick run: one fault, briefly; not a measurement) and put the section in
    ``out``; the raw results in ``state``/recovery/recovery.json."""
    started = datetime.datetime.now(datetime.UTC)
    folder = state / "recovery"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    faults, timing = (FAULTS[:1], QUICK) if quick else (FAULTS, Timing())
    results = await run_faults(folder, faults, timing, measured=not quick)
    (folder / "recovery.json").write_text(json.dumps([r.to_json() for r in results]))
    minutes = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
    note = (f"Measured by `{command}` on {started:%Y-%m-%d %H:%M} UTC in {minutes:.1f} minutes "
            f"({machine}). " + method(results[0].rate if results else 0.0, timing.before_s,
                                      timing.after_s))
    if quick:
        note = (f"A smoke run of `{command}` on {started:%Y-%m-%d %H:%M} UTC: one fault, "
                f"{timing.before_s:g} + {timing.after_s:g} s of load. **Not a measurement**: "
                "`python -m loadtest.bench --only recovery` measures every fault.")
    text = out.read_text() if out.exists() else ""
    out.write_text(replace_section(text, lines(results, note), HEADING))
    return results
