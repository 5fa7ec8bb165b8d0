"""Redis memory per unfinished task and per kept result, measured on a private redis-server
through Ferry's own code paths, for the sizing rule of ``ferry.planner.memory``.

Each run flushes the server, creates the partitions' streams and group as a batcher does, then:
admits N tasks built as the gateway builds a ``/v1`` request's (``RedisTaskStore.admit``: the
PENDING record, the stream entry holding the envelope and payload, the digest key of the result
cache and collapsing, all on by default); reads them through the consumer group as a batcher does
(``RedisStreamQueue.read``: each entry also pending in the group); completes them in batches of
64 with the batcher's own ``Outcome.completion`` (``RedisTaskStore.complete``: final records kept
``result_ttl_s``, entries acknowledged and deleted, the digest key kept ``cache_ttl_s`` as the
cache); then deletes the digest keys. INFO memory's ``used_memory`` is read after each step with
Ferry's connections closed, less the asking connection's buffers (clients' buffers are transient:
the planner's headroom counts them); the deltas divided by N are the bytes per task, as jemalloc
rounds them (size classes four per doubling: up to 25% over the size asked for). Answers are the
sim model's (its output is a hash and a length, about 105 bytes of JSON whatever the input) and
an echo of the payload (a result as large as the payload). The slow log is off while measuring.

    .venv/bin/python -m loadtest.redis_memory --out redis-memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from redis import asyncio as aioredis

from ferry import keys
from ferry.batcher.executor import Outcome
from ferry.codec import outputs_to_json
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import lean
from ferry.resp.client import RedisAddress
from ferry.settings import CommonSettings
from ferry.stack.redis_server import start_redis
from ferry.tasks.base import Sharing, input_digest
from ferry.tasks.record import Status, TaskRecord
from ferry.tasks.redis_store import RedisTaskStore
from ferry.v1.task_pb2 import Task

MODEL, VERSION = "sim", "1"
BATCH = 64  # tasks per completion call, as a batcher's largest batch
ADMIT_AT_ONCE = 256  # admissions in flight at once, pipelined as the gateway's are
RESULTS = ("sim", "echo")
FIRM_BYTES = 1 << 20
CONNECTIONS = 100  # idle connections opened to measure one's cost
SETTLE_S = 0.2  # for Redis to free the closed connections
DEFAULT_SIZES = "2048:2000,204800:200,1048576:100"  # payload bytes : tasks


@dataclass(frozen=True)
class Run:
    """One measured run: a payload size, N tasks, the kind of answer, and bytes per task."""

    payload_bytes: int
    tasks: int
    result: str  # "sim" (its ~90-byte answer) or "echo" (an answer as large as the payload)
    output_bytes: float  # the answer's JSON, as GET /v1/result shows it under "output"
    record_bytes: float  # the final record's body
    queued: float  # per task admitted, not read yet
    held: float  # per task read by a batcher, not finished (its entry pending in the group)
    kept: float  # per finished task: its kept result, with its cache entry
    kept_uncached: float  # per finished task, without the cache entry
    cache_entry: float  # per cache entry (a reusable answer's digest key)
    fixed: float  # the flushed server with Ferry's streams and group, before the tasks

    @property
    def unfinished_ratio(self) -> float:
        return self.held / self.payload_bytes

    @property
    def result_ratio(self) -> float:
        return self.kept_uncached / self.output_bytes


@dataclass(frozen=True)
class Line:
    """bytes = base + per_byte · size, at or above every size measured."""

    base: float
    per_byte: float
    over: float  # how much more than measured it says, at most, at the sizes measured (share)
    under: float  # how much less, at most (0 when no point lies above it)

    def at(self, size: float) -> float:
        return self.base + self.per_byte * size


def upper_line(points: Sequence[tuple[float, float]]) -> Line:
    """A line on or above the points (size, bytes): through the dearest point of the smallest
    size (sizes within twice it count as it: the sim model's answers vary by a few bytes), and
    as steep as the steepest way from there to a larger size. jemalloc's size classes make the
    cost a staircase (four classes per doubling: up to 25% over the size asked for), so a line
    through two sizes alone may pass below a third."""
    smallest = min(x for x, _ in points)
    near = [p for p in points if p[0] <= 2 * smallest]
    far = [p for p in points if p[0] > 2 * smallest]
    if not far:
        raise ValueError("a line needs a size more than twice the smallest")
    x0, y0 = max(near, key=lambda p: p[1])
    per_byte = max((y - y0) / (x - x0) for x, y in far)
    base = y0 - per_byte * x0
    return Line(base, per_byte, max((base + per_byte * x - y) / y for x, y in points),
                max(0.0, *((y - base - per_byte * x) / y for x, y in points)))


def firm(per_task: float, tasks: int) -> bool:
    """Whether a figure is well above the noise: a run's total moves by a few tens of KB from
    one run to the next, so a figure counts when it sums to at least FIRM_BYTES over the run."""
    return per_task * tasks >= FIRM_BYTES


def payload_of(size: int) -> bytes:
    """Random printable bytes (base64's alphabet): a text echo of them is as large in JSON."""
    return base64.b64encode(os.urandom(size))[:size]


def sim_answer(payload: bytes) -> bytes:
    """What the sim model answers (``model_repository/sim/1/model.py``): hash and length."""
    described = {"sha256": hashlib.sha256(payload).hexdigest(), "length": len(payload)}
    return json.dumps(described, sort_keys=True).encode()


def output_of(payload: bytes, result: str) -> Any:
    """The task's output as the batcher records it (``outputs_to_json`` of the OUTPUT row)."""
    answer = sim_answer(payload) if result == "sim" else payload
    return outputs_to_json({"OUTPUT": [answer]})


def gateway_task(payload: bytes, partitions: int) -> tuple[Task, TaskRecord, Sharing]:
    """A raw ``/v1`` request's task, PENDING record and sharing, as ``GatewayService._new_task``
    builds them under the default settings (no deadline, no auth, result cache and collapsing
    on: the digest names the partition)."""
    now = time.time()
    digest = input_digest(MODEL, VERSION, payload)
    task_id = keys.new_task_id(keys.partition_of_digest(digest, partitions), partitions)
    task = Task(task_id=task_id, model=MODEL, payload=payload,
                content_type="application/octet-stream", enqueued_at_ms=int(now * 1000),
                priority=int(Priority.NORMAL), input_digest=digest, digest_version=VERSION)
    return task, TaskRecord.pending(task, now), Sharing(digest, lookup=True, collapse=True)


@dataclass(frozen=True)
class Ferry:
    """Ferry's clients of one Redis: the gateway's and the batcher's store, the queue."""

    store: RedisTaskStore
    queue: RedisStreamQueue
    redis: aioredis.Redis

    async def used(self, *, clients: bool = False) -> int:
        """used_memory with Ferry's connections closed (their buffers are transient, counted in
        the headroom), less the buffers of the one connection that asks (unless ``clients``)."""
        await self.store.client.close()
        await self.queue.close()
        await self.redis.connection_pool.disconnect()
        await asyncio.sleep(SETTLE_S)
        info = await self.redis.info("memory")
        return int(info["used_memory"]) - (0 if clients else int(info["mem_clients_normal"]))

    async def flush(self) -> int:
        # The slow log keeps the arguments (up to 4 KB) of up to 128 slow commands: bounded, and
        # noise here (an admission of a large payload is slow).
        await self.redis.config_set("slowlog-log-slower-than", -1)
        await self.redis.slowlog_reset()
        await self.redis.flushall(asynchronous=False)
        await self.queue.ensure_groups()
        return await self.used()


@contextlib.asynccontextmanager
async def ferry_clients(redis_url: str) -> AsyncIterator[Ferry]:
    settings = CommonSettings(redis_url=redis_url)
    hot, reader = lean(settings, "measure-store"), lean(settings, "measure-reader")
    redis = aioredis.Redis.from_url(redis_url)  # the measurer's own: INFO, CONFIG, FLUSHALL
    partitions = settings.partitions
    queue = RedisStreamQueue(hot, reader, partitions=partitions, owned=range(partitions),
                             consumer="measure")
    store = RedisTaskStore(hot, partitions=partitions, result_ttl_s=settings.result_ttl_s,
                           pending_ttl_s=settings.pending_ttl_s,
                           cache_ttl_s=settings.cache_ttl_s)
    try:
        yield Ferry(store, queue, redis)
    finally:
        await queue.close()
        await hot.close()
        await redis.aclose()


async def admit_all(ferry: Ferry, payloads: Sequence[bytes]) -> None:
    partitions = ferry.store.partitions
    for start in range(0, len(payloads), ADMIT_AT_ONCE):
        made = [gateway_task(p, partitions) for p in payloads[start:start + ADMIT_AT_ONCE]]
        await asyncio.gather(*(ferry.store.admit(task, pending, sharing=sharing)
                               for task, pending, sharing in made))


async def read_all(ferry: Ferry, count: int) -> list[Delivery]:
    deliveries: list[Delivery] = []
    while len(deliveries) < count:
        got = await ferry.queue.read(BATCH, 0)
        if not got:
            raise RuntimeError(f"read {len(deliveries)} of {count} entries")
        deliveries += got
    return deliveries


async def complete_all(ferry: Ferry, deliveries: Sequence[Delivery], result: str) -> float:
    """Complete every delivery as a batcher does; the mean record body's size."""
    body = 0
    for start in range(0, len(deliveries), BATCH):
        now = time.time()
        completions = [Outcome(d, Status.SUCCESS, output=output_of(d.task.payload, result),
                               model_version=VERSION).completion(now)
                       for d in deliveries[start:start + BATCH] if d.task is not None]
        written = await ferry.store.complete(completions)
        if not all(written):
            raise RuntimeError("a completion wrote nothing")
        body += sum(len(c.record.encode().body) for c in completions if c.record is not None)
    return body / len(deliveries)


async def drop_cache_entries(ferry: Ferry) -> int:
    dropped = 0
    for partition in range(ferry.store.partitions):
        pattern = keys.cache_key_prefix(partition) + "*"
        names = [name async for name in ferry.redis.scan_iter(match=pattern, count=1000)]
        if names:
            dropped += int(await ferry.redis.delete(*names))
    return dropped


async def warm_up(ferry: Ferry) -> None:
    """One task's whole life first, so that the scripts' cache is not counted as a task's."""
    await ferry.flush()
    await admit_all(ferry, [payload_of(64)])
    await complete_all(ferry, await read_all(ferry, 1), "sim")


async def measure(ferry: Ferry, payload_bytes: int, tasks: int, result: str) -> Run:
    payloads = [payload_of(payload_bytes) for _ in range(tasks)]
    fixed = await ferry.flush()
    await admit_all(ferry, payloads)
    queued = await ferry.used()
    deliveries = await read_all(ferry, tasks)
    held = await ferry.used()
    body = await complete_all(ferry, deliveries, result)
    kept = await ferry.used()
    if await drop_cache_entries(ferry) != tasks:
        raise RuntimeError("expected one cache entry per task")
    uncached = await ferry.used()
    output = sum(len(orjson.dumps(output_of(p, result))) for p in payloads) / tasks
    return Run(payload_bytes, tasks, result, output, body, (queued - fixed) / tasks,
               (held - fixed) / tasks, (kept - fixed) / tasks, (uncached - fixed) / tasks,
               (kept - uncached) / tasks, fixed)


async def connection_bytes(ferry: Ferry, url: str, count: int = CONNECTIONS) -> float:
    """What one more client connection costs after a command (each gateway worker and batcher
    holds a few), its buffers included this time."""
    address = RedisAddress.from_url(url)
    before = await ferry.used(clients=True)
    opened = [await asyncio.open_connection(address.host, address.port) for _ in range(count)]
    try:
        for reader, writer in opened:
            writer.write(b"PING\r\n")
            await reader.readline()
        after = await ferry.used(clients=True)
    finally:
        for _, writer in opened:
            writer.close()
    return (after - before) / count


@dataclass(frozen=True)
class Report:
    redis_version: str
    allocator: str
    empty_server: int  # used_memory less clients' buffers of a fresh server, nothing written
    connection: float  # per client connection, after a command
    runs: list[Run]

    def unfinished_line(self) -> Line:
        """Bytes per unfinished task (the larger, held: read by a batcher) by payload size."""
        return upper_line([(r.payload_bytes, r.held) for r in self.runs
                           if firm(r.held, r.tasks)])

    def result_line(self) -> Line:
        """Bytes per kept result (without its cache entry) by the output's size."""
        return upper_line([(r.output_bytes, r.kept_uncached) for r in self.runs
                           if firm(r.kept_uncached, r.tasks)])

    @property
    def fixed(self) -> float:
        return max(r.fixed for r in self.runs)

    @property
    def cache_entry(self) -> float:
        """From the runs of the most tasks (a cache entry is small: the others are noise)."""
        most = max(r.tasks for r in self.runs)
        return max(r.cache_entry for r in self.runs if r.tasks == most)


async def measure_all(redis_url: str, sizes: Sequence[tuple[int, int]],
                      progress: Callable[[str], None] = print) -> Report:
    async with ferry_clients(redis_url) as ferry:
        info = await ferry.redis.info("server")
        empty = await ferry.used()
        await warm_up(ferry)
        connection = await connection_bytes(ferry, redis_url)
        runs = []
        for payload_bytes, tasks in sizes:
            for result in RESULTS:
                runs.append(await measure(ferry, payload_bytes, tasks, result))
                progress(f"measured {tasks} tasks of {payload_bytes:,} bytes, {result} answers")
        allocator = str((await ferry.redis.info("memory"))["mem_allocator"])
    return Report(str(info["redis_version"]), allocator, empty, connection, runs)


def table(report: Report) -> str:
    head = (f"{'payload':>9} {'tasks':>6} {'answer':>6} {'output':>8} {'queued':>9} "
            f"{'held':>9} {'ratio':>6} {'kept':>9} {'uncached':>9} {'ratio':>6} {'cache':>6}")
    rows = [f"{r.payload_bytes:>9,} {r.tasks:>6} {r.result:>6} {r.output_bytes:>8,.0f} "
            f"{r.queued:>9,.0f} {r.held:>9,.0f} {r.unfinished_ratio:>6.2f} "
            f"{_cell(r.kept, r.tasks, 9)} {_cell(r.kept_uncached, r.tasks, 9)} "
            f"{r.result_ratio:>6.2f} {_cell(r.cache_entry, r.tasks, 6)}" for r in report.runs]
    unfinished, kept = report.unfinished_line(), report.result_line()
    return "\n".join([
        f"Redis {report.redis_version} ({report.allocator}): bytes of used_memory (less client "
        "buffers) per task; ratio: to the payload (held) and to the output (uncached)", "",
        head, *rows, "",
        f"empty server {report.empty_server:,} B; with Ferry's streams and group "
        f"{report.fixed:,.0f} B; a client connection {report.connection:,.0f} B",
        f"unfinished task = {unfinished.base:,.0f} + {unfinished.per_byte:.4f} · payload "
        f"({_off(unfinished)})",
        f"kept result     = {kept.base:,.0f} + {kept.per_byte:.4f} · output ({_off(kept)})",
        f"cache entry     = {report.cache_entry:,.0f} (from the runs of the most tasks)",
        f"~: under {FIRM_BYTES >> 20} MiB over its run, within the noise: shown, not fitted"])


def _cell(per_task: float, tasks: int, width: int) -> str:
    mark = "" if firm(per_task, tasks) else "~"
    return f"{mark}{per_task:,.0f}".rjust(width)


def _off(line: Line) -> str:
    return (f"at the sizes measured: up to {line.over:.0%} over, "
            f"{line.under:.1%} under")


def report_json(report: Report) -> dict[str, Any]:
    unfinished, kept = report.unfinished_line(), report.result_line()
    return {"redis_version": report.redis_version, "allocator": report.allocator,
            "empty_server_bytes": report.empty_server, "fixed_bytes": report.fixed,
            "connection_bytes": report.connection,
            "runs": [asdict(r) | {"unfinished_ratio": r.unfinished_ratio,
                                  "result_ratio": r.result_ratio} for r in report.runs],
            "rule": {"unfinished": asdict(unfinished), "kept_result": asdict(kept),
                     "cache_entry_bytes": report.cache_entry}}


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``2048:2000,204800:200``: payload bytes and tasks of each run."""
    pairs = [item.split(":") for item in text.split(",") if item.strip()]
    return [(int(size), int(tasks)) for size, tasks in pairs]


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git on PATH
                          capture_output=True, text=True, check=False)
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="payload bytes:tasks, "
                        f"comma-separated (default {DEFAULT_SIZES})")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferry-redis-memory-") as state:
        proc, url = start_redis(Path(state))
        try:
            report = asyncio.run(measure_all(url, parse_sizes(args.sizes)))
        finally:
            proc.stop(grace_s=5)
    print(table(report))
    if args.out:
        figures = report_json(report) | {"commit": commit(), "measured_at": time.time()}
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
