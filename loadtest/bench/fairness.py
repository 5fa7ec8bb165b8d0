"""Fair share: what a flood does to a light client's latency, first come first served and with
fair share between clients (docs/fairness.md), against the light client alone.

One Triton serving the slow simulated backend (t(B) = 50 + 2·B ms, 1 instance) and one Redis
for every run; each run on a fresh gateway process and batcher (Ferry's default settings but
``FERRY_FAIR_SHARE_AFTER``) and an emptied Redis. Two clients in one asyncio process, open
loop, Poisson arrivals drawn in advance, distinct inputs, each naming itself in the body's
``client_id``: the **flood** at twice the backend's capacity, each ``POST /v1/inference``
accepted (202) or refused (429) and not waited for; the **light** client at a low rate with
``Prefer: wait``, its latency from each request's scheduled send to its answer. Three runs:
the light client alone, then with the flood under FIFO (``FERRY_FAIR_SHARE_AFTER=0``), then
with fair share (the default). Reported (``loadtest.bench.fairness_report``): the light
client's requests and latency, the flood's accepted and refused, and how busy the backend
was (Triton's own statistics).

    .venv/bin/python -m loadtest.bench --only fairness    # about 2 minutes; that section
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from ferry import keys
from ferry.settings import BatcherSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_server import start_redis
from ferry.stack.triton_server import start_triton
from ferry.tasks.capacity import freshest
from loadtest.bench.backends import SLOW, Scenario, write_repository
from loadtest.bench.fairness_report import FIGURE, HEADING, Client, Run, draw, lines
from loadtest.bench.goodput import replace_section
from loadtest.bench.sweep import TritonCounts, TritonStats
from loadtest.flows import digest_matches, new_nonce
from loadtest.generator import cpu_seconds, drive, schedule
from loadtest.rawhttp import Pool, Response

log = logging.getLogger(__name__)

SCENARIO = Scenario(SLOW, 1)
FLOOD_SHARE = 2.0  # of the backend's capacity at full batches (360/s): 719/s
LIGHT_RATE = 10.0  # requests per second
PAYLOAD_BYTES = 512
PREFER_WAIT_S = 30  # the gateway's longest wait (FERRY_MAX_POLL_S)
FAILURES = (OSError, TimeoutError, ConnectionError, ValueError, asyncio.IncompleteReadError)
PATH = "/v1/inference"


@dataclass(frozen=True)
class Timing:
    seconds: float = 20.0  # of load
    answer_s: float = 90.0  # the longest a light request is waited for, from its send


QUICK = Timing(seconds=3.0, answer_s=60.0)


@dataclass(frozen=True)
class Mode:
    """One way to run: the gateway's FERRY_FAIR_SHARE_AFTER, and whether the flood runs."""

    name: str
    label: str
    fair_after: int
    flood: bool = True


MODES = (Mode("alone", "light client alone", 4, flood=False),
         Mode("fifo", "FIFO (FERRY_FAIR_SHARE_AFTER=0)", 0),
         Mode("fair", "fair share (default, 4)", 4))


# -- the servers ------------------------------------------------------------------------------


@dataclass
class Backbone:
    """Triton (the slow backend's model alone) and Redis, for every run."""

    state: Path
    processes: list[ManagedProcess] = field(default_factory=list)
    triton_grpc: str = ""
    triton_http: str = ""
    redis_url: str = ""

    def start(self) -> None:
        repository = write_repository(self.state / "models", [SCENARIO], 50.0)
        for variant in ("triton-dyn0", "triton-dyn50"):  # Triton starts faster without them
            shutil.rmtree(repository / SCENARIO.model(variant))
        triton, ports = start_triton(repository, self.state / "triton", timeout_s=180)
        self.processes.append(triton)
        self.triton_grpc, self.triton_http = (f"{LOOPBACK}:{ports.grpc}",
                                              f"{LOOPBACK}:{ports.http}")
        redis_proc, self.redis_url = start_redis(self.state / "redis")
        self.processes.append(redis_proc)

    def flush(self) -> None:
        """Every run starts from an empty Redis (the last run's flood gone)."""
        with redis.Redis.from_url(self.redis_url) as client:
            client.flushall()

    def capacity(self) -> float:
        """The model's rate as the batchers report it now (0: not measured)."""
        with redis.Redis.from_url(self.redis_url) as client:
            reports = client.hgetall(keys.CAPACITY_KEY)
        found = freshest(reports, time.time()).get(SCENARIO.name)
        return found.rate if found is not None else 0.0

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop(grace_s=20)


@contextlib.contextmanager
def ferry(backbone: Backbone, mode: Mode, folder: Path) -> Iterator[int]:
    """A gateway process (a worker per core) and a batcher with Ferry's defaults but the mode's
    FERRY_FAIR_SHARE_AFTER; yields the gateway's port once both are ready."""
    port, metrics = free_port(), free_port()
    gateway = GatewaySettings(redis_url=backbone.redis_url, triton_url=backbone.triton_grpc,
                              port=port, grpc_port=0, default_model=SCENARIO.name, jobs=False,
                              job_store_dir=str(folder / "jobs"),
                              fair_share_after=mode.fair_after)
    batcher = BatcherSettings(redis_url=backbone.redis_url, triton_url=backbone.triton_grpc,
                              triton_http_url=backbone.triton_http, metrics_port=metrics)
    procs = [ManagedProcess(name, [sys.executable, "-m", "ferry", name],
                            env=env_with(to_env(settings, type(settings))),
                            log_path=folder / f"{name}.log")
             for name, settings in (("batcher", batcher), ("gateway", gateway))]
    try:
        for proc in procs:
            proc.start()
        procs[0].wait_ready(lambda: http_ok(f"http://{LOOPBACK}:{metrics}/readyz"), 60)
        procs[1].wait_ready(lambda: http_ok(f"http://{LOOPBACK}:{port}/readyz"), 60)
        time.sleep(1.0)  # every gateway worker is up
        yield port
    finally:
        for proc in reversed(procs):
            proc.stop(grace_s=20)


# -- the clients ------------------------------------------------------------------------------


def input_text(who: str, nonce: str, index: int) -> str:
    """A distinct input (Ferry's result cache never answers one)."""
    head = f"{who}-{nonce}-{index}-"
    return head + "x" * max(0, PAYLOAD_BYTES - len(head))


class Sender:
    """One client's requests on keep-alive connections of its own, counted in its ``Client``."""

    def __init__(self, port: int, client: Client, *, wait: bool, answer_s: float) -> None:
        self.pool = Pool(LOOPBACK, port)
        self.client = client
        self.wait = wait  # hold for the answer (the light client), or not (the flood)
        self.answer_s = answer_s
        self.nonce = new_nonce()

    async def __call__(self, index: int, scheduled: float) -> None:
        self.client.sent += 1
        data = input_text(self.client.name, self.nonce, index)
        body = orjson.dumps({"model": SCENARIO.name, "input": data,
                             "client_id": self.client.name})
        headers = (("Prefer", f"wait={PREFER_WAIT_S}"),) if self.wait else ()
        try:
            response = await self.pool.request("POST", PATH, body, "application/json", headers)
            outcome = await self._outcome(response, data.encode(), scheduled)
        except FAILURES as exc:
            outcome = type(exc).__name__
        if outcome == "SUCCESS":
            self.client.answered += 1
            self.client.latencies_ms.append(round((time.perf_counter() - scheduled) * 1e3, 2))
        elif outcome == "HTTP 429":
            self.client.refused += 1
        elif outcome != "ACCEPTED":
            self.client.errors[outcome] += 1

    async def _outcome(self, response: Response, data: bytes, scheduled: float) -> str:
        if response.status not in (200, 202):
            return f"HTTP {response.status}"
        self.client.accepted += 1
        if not self.wait:
            return "ACCEPTED"
        record: dict[str, Any] = response.json()
        while record.get("status") == "PENDING":  # Prefer's wait ended first: long-poll
            left = self.answer_s - (time.perf_counter() - scheduled)
            if left <= 0:
                return "no answer in time"
            polled = await self.pool.request(
                "GET", f"{record['status_url']}?wait={max(1, min(PREFER_WAIT_S, int(left)))}")
            if polled.status != 200:
                return f"HTTP {polled.status} (poll)"
            record = polled.json()
        if record.get("status") != "SUCCESS":
            return str(record.get("status"))
        ok = digest_matches(record.get("output", {}).get("OUTPUT"), data)
        return "SUCCESS" if ok else "WRONG_ANSWER"

    async def close(self) -> None:
        await self.pool.close()




# -- one run ----------------------------------------------------------------------------------


@dataclass
class Window:
    """What Triton executed while the load ran (its counts read at both ends), in how long,
    and the generator's CPU over the run."""

    counts: TritonCounts
    at: float
    cpu_s: float
    seconds: float = 0.0


async def load(port: int, mode: Mode, timing: Timing, seed: int, stats: TritonStats
               ) -> tuple[Client, Client | None, Window, int]:
    """Both clients for ``timing.seconds``; Triton's counts at both ends of the load; every
    light request waited for."""
    capacity = SCENARIO.backend.batched_capacity(SCENARIO.instances)
    light = Client("light", LIGHT_RATE)
    flood = Client("flood", round(FLOOD_SHARE * capacity)) if mode.flood else None
    senders = [Sender(port, light, wait=True, answer_s=timing.answer_s)]
    if flood is not None:
        senders.append(Sender(port, flood, wait=False, answer_s=timing.answer_s))
    window = Window(await stats.counts(SCENARIO.name), time.perf_counter(), cpu_seconds())
    start = window.at + 0.05
    try:
        driven = await asyncio.gather(*(drive(
            schedule(s.client.rate, max(1, round(s.client.rate * timing.seconds)),
                     seed=seed + i), start, s) for i, s in enumerate(senders)))
        await asyncio.sleep(max(0.0, start + timing.seconds - time.perf_counter()))
        window.counts = (await stats.counts(SCENARIO.name)).minus(window.counts)
        window.seconds = time.perf_counter() - window.at
        await asyncio.wait([t for tasks, _ in driven for t in tasks],
                           timeout=timing.answer_s + 5)
    finally:
        for sender in senders:
            await sender.close()
    window.cpu_s = cpu_seconds() - window.cpu_s
    return light, flood, window, sum(late for _, late in driven)


async def warm_up(port: int) -> None:
    """A few answered requests before the run (connections, the model's first calls)."""
    sender = Sender(port, Client("warm-up", 0.0), wait=True, answer_s=30.0)
    try:
        await asyncio.gather(*(sender(i, time.perf_counter()) for i in range(8)))
    finally:
        await sender.close()


async def run_mode(backbone: Backbone, mode: Mode, timing: Timing, seed: int, folder: Path,
                   *, measured: bool) -> Run:
    """One mode on a fresh gateway and batcher, with Redis emptied first."""
    await asyncio.to_thread(backbone.flush)
    stats = TritonStats(backbone.triton_grpc)
    try:
        with ferry(backbone, mode, folder / mode.name) as port:
            await warm_up(port)
            light, flood, window, late = await load(port, mode, timing, seed, stats)
            capacity = await asyncio.to_thread(backbone.capacity)
    finally:
        await stats.close()
    ran = window.counts
    run = Run(mode.name, mode.label, mode.fair_after, timing.seconds, light, flood,
              busy=round(ran.busy_ns / 1e9 / window.seconds, 3),
              ran_per_s=round(ran.inferences / window.seconds, 1),
              mean_batch=round(ran.inferences / max(1, ran.executions), 1),
              capacity_per_s=round(capacity, 1), late_sends=late,
              generator_cpu_s=round(window.cpu_s, 2), measured=measured)
    log.info("fairness %s: light %d sent, %d answered, %d refused, p99 %s ms; flood %s; "
             "busy %.0f%%", mode.name, light.sent, light.answered, light.refused,
             light.percentile(99), flood and f"{flood.accepted} accepted, {flood.refused} "
             "refused", run.busy * 100)
    return run


async def measure(folder: Path, timing: Timing, *, measured: bool = True) -> list[Run]:
    """Every mode in turn on one Triton and one Redis."""
    backbone = Backbone(folder)
    await asyncio.to_thread(backbone.start)
    try:
        return [await run_mode(backbone, mode, timing, 41 + 10 * index, folder,
                               measured=measured) for index, mode in enumerate(MODES)]
    finally:
        await asyncio.to_thread(backbone.stop)


def method(timing: Timing) -> str:
    """How the section was measured, in words."""
    capacity = SCENARIO.backend.batched_capacity(SCENARIO.instances)
    return (
        f"One Triton ({SCENARIO.title}: {capacity:.0f} tasks/s at full batches) and one Redis; "
        "each run on a fresh gateway process (a worker per core) and batcher with Ferry's "
        "default settings but `FERRY_FAIR_SHARE_AFTER`, Redis emptied before it. Two clients "
        "in one asyncio process (keep-alive HTTP/1.1, `loadtest/rawhttp.py`), open loop, "
        f"Poisson arrivals drawn in advance, distinct {PAYLOAD_BYTES}-byte inputs, each "
        "naming itself in the JSON body's `client_id`, both for "
        f"{timing.seconds:g} s: the **flood** at {FLOOD_SHARE:g} times the capacity "
        f"({FLOOD_SHARE * capacity:.0f}/s), each `POST /v1/inference` accepted (202) or "
        "refused (429) and not waited for; the **light** client at "
        f"{LIGHT_RATE:g}/s with `Prefer: wait={PREFER_WAIT_S}` (still pending after it: "
        "long-polled), its latency from each request's scheduled send to its own input's "
        "answer, the percentiles over its answered requests; 429s are refused, not retried. "
        "Backend busy: the model's execution time in Triton's own statistics (`compute_infer` "
        "summed over its batch statistics, gRPC `ModelStatistics` on Triton's port) over the "
        f"{timing.seconds:g} s of load; Triton ran: the inferences it executed per second in "
        "that time. The backlog limit is Ferry's automatic one (the measured capacity times "
        "`FERRY_MAX_QUEUE_WAIT_S`, 10 s): first come first served, a full backlog refuses "
        "every client; with fair share, only the flows that hold their share of it. Raw "
        "results: `.bench/fairness/fairness.json`, each run's logs beside it.")


async def write_section(out: Path, figures: Path, state: Path, *, quick: bool, command: str,
                        machine: str) -> list[Run]:
    """Measure (a --quick run: a few seconds each; not a measurement) and put the section and
    its figure in ``out`` and ``figures``; the raw results in ``state``/fairness."""
    started = datetime.datetime.now(datetime.UTC)
    folder = state / "fairness"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    timing = QUICK if quick else Timing()
    runs = await measure(folder, timing, measured=not quick)
    (folder / "fairness.json").write_text(json.dumps([r.to_json() for r in runs]))
    figures.mkdir(parents=True, exist_ok=True)
    figure = figures / FIGURE
    draw(runs, figure)
    minutes = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
    note = (f"Measured by `{command}` on {started:%Y-%m-%d %H:%M} UTC in {minutes:.1f} minutes "
            f"({machine}). " + method(timing))
    if quick:
        note = (f"A smoke run of `{command}` on {started:%Y-%m-%d %H:%M} UTC: "
                f"{timing.seconds:g} s of load per run. **Not a measurement**: "
                "`python -m loadtest.bench --only fairness` measures it.")
    report = out.read_text() if out.exists() else ""
    section = lines(runs, note, os.path.relpath(figure, out.parent))
    out.write_text(replace_section(report, section, HEADING))
    return runs
