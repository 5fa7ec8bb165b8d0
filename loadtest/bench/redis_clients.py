"""Which Redis client for Ferry's hot path: ``ferry.resp`` against redis-py (asyncio, with
hiredis) and coredis, on the commands Ferry sends most.

One private redis-server on a loopback port; each client as it comes (its defaults: redis-py's
connection pool, coredis's multiplexed connections, ``ferry.resp``'s one pipelined connection),
all in this one process under uvloop, as Ferry's services run. Three workloads:

- ``admit``: EVALSHA of a small script like Ferry's admission (HSET a record with a TTL, XADD to
  a stream; ~300 bytes of arguments), through each client's own script object;
- ``hget``: HGET of a 500-byte value;
- ``pipeline``: a pipeline of 16 HGETs (no MULTI), one round trip.

each at concurrency 1 (one caller awaiting in a loop: light load) and 64 (64 tasks sharing one
client). The clients take turns, a fixed number of calls each, the order rotated every round so
the machine's drift hits all alike. Measured: this process's CPU (``time.process_time``: every
thread) over the calls, per command (a pipeline is 16 commands), and commands per second of
wall time; medians over the rounds, and each client's ratio to ``ferry.resp``.

    .venv/bin/python -m loadtest.bench.redis_clients            # ~60 s: the table
    .venv/bin/python -m loadtest.bench --only redis-clients     # that section of BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import coredis
import hiredis
import redis.asyncio
import uvloop

from ferry.resp.client import RedisAddress, RespClient
from ferry.stack.redis_server import start_redis
from loadtest.bench.goodput import replace_section

HEADING = "## Which Redis client (Ferry's hot path)"
ROOT = Path(__file__).resolve().parents[2]

# Like tasks/lua/admit.lua's core for one task: the record, its TTL, its stream entry.
SCRIPT = """\
-- bench admit: KEYS task, stream; ARGV id, body, ttl (s), maxlen
local task, stream = KEYS[1], KEYS[2]
local id, body, ttl, maxlen = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if redis.call('EXISTS', task) == 1 and redis.call('HGET', task, 'status') ~= 'PENDING' then
  return {0, ''}
end
redis.call('HSET', task, 'status', 'PENDING', 'body', body, 'id', id)
redis.call('EXPIRE', task, ttl)
local entry = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'id', id)
return {1, entry}
"""
BODY = b'{"model":"bench","input":"' + b"x" * 220 + b'","priority":"normal"}'
VALUE = bytes(range(32, 127)) * 5 + b"....."  # 480 + 20 bytes
HASH_KEYS = [f"bench:hash:{i}" for i in range(64)]
TASK_KEYS = 4096  # task records reused round robin: Redis's memory stays flat
STREAM = "bench:stream"
PIPELINE = 16
WORKLOADS = ("admit", "hget", "pipeline")
WORKLOAD_NAMES = {"admit": "EVALSHA admit (HSET + EXPIRE + XADD)", "hget": "HGET (500 B)",
                  "pipeline": f"pipeline of {PIPELINE} HGETs"}
COMMANDS = {"admit": 1, "hget": 1, "pipeline": PIPELINE}
CONCURRENCY = (1, 64)
REFERENCE = "ferry.resp"


class Candidate(Protocol):
    """The three calls measured, made through one client."""

    name: str

    async def admit(self, task: str, args: Sequence[bytes]) -> Any: ...

    async def hget(self, key: str) -> Any: ...

    async def hgets(self, keys: Sequence[str]) -> list[Any]: ...

    async def close(self) -> None: ...


class Resp:
    """``ferry.resp.RespClient``: one pipelined connection, hiredis."""

    name = REFERENCE

    def __init__(self, url: str) -> None:
        self.client = RespClient(RedisAddress.from_url(url))
        self.script = self.client.register_script(SCRIPT)

    async def admit(self, task: str, args: Sequence[bytes]) -> Any:
        return await self.client.execute(*self.script.command((task, STREAM), args))

    async def hget(self, key: str) -> Any:
        return await self.client.execute("HGET", key, "v")

    async def hgets(self, keys: Sequence[str]) -> list[Any]:
        return await self.client.pipeline([("HGET", k, "v") for k in keys])

    async def close(self) -> None:
        await self.client.close()


class RedisPy:
    """``redis.asyncio.Redis`` with its default connection pool (hiredis parses its replies)."""

    name = "redis-py"

    def __init__(self, url: str) -> None:
        self.client = redis.asyncio.Redis.from_url(url)
        self.script = self.client.register_script(SCRIPT)

    async def admit(self, task: str, args: Sequence[bytes]) -> Any:
        return await self.script(keys=[task, STREAM], args=list(args))

    async def hget(self, key: str) -> Any:
        return await self.client.hget(key, "v")

    async def hgets(self, keys: Sequence[str]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "v")
            return await pipe.execute()

    async def close(self) -> None:
        await self.client.aclose()


class Coredis:
    """``coredis.Redis`` with its defaults (RESP3, its own C parser); used as the async context
    manager it must be since 6.0."""

    name = "coredis"

    def __init__(self, url: str) -> None:
        self.client: coredis.Redis[bytes] = coredis.Redis.from_url(url)
        self.script = self.client.register_script(SCRIPT)
        self.stack = contextlib.AsyncExitStack()

    async def open(self) -> Coredis:
        await self.stack.enter_async_context(self.client)
        return self

    async def admit(self, task: str, args: Sequence[bytes]) -> Any:
        return await self.script(keys=[task, STREAM], args=list(args))

    async def hget(self, key: str) -> Any:
        return await self.client.hget(key, "v")

    async def hgets(self, keys: Sequence[str]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "v")
        return list(pipe.results or ())

    async def close(self) -> None:
        await self.stack.aclose()


async def candidates(url: str) -> list[Candidate]:
    """Every client, opened."""
    return [Resp(url), RedisPy(url), await Coredis(url).open()]


def admit_args(i: int) -> tuple[str, list[bytes]]:
    """The i-th call's task key and its arguments (~300 bytes)."""
    return f"bench:task:{i % TASK_KEYS}", [b"%032x" % i, BODY, b"300", b"10000"]


def operation(client: Candidate, workload: str) -> Callable[[int], Awaitable[Any]]:
    """The workload's i-th call on ``client``."""
    if workload == "admit":
        return lambda i: client.admit(*admit_args(i))
    if workload == "hget":
        return lambda i: client.hget(HASH_KEYS[i % len(HASH_KEYS)])
    return lambda i: client.hgets([HASH_KEYS[(i + j) % len(HASH_KEYS)]
                                   for j in range(PIPELINE)])


async def check(client: Candidate) -> None:
    """Each call answers what Redis holds (the first calls also open the connections)."""
    value = await client.hget(HASH_KEYS[0])
    values = await client.hgets(HASH_KEYS[:PIPELINE])
    admitted = await client.admit(*admit_args(0))
    if value != VALUE or list(values) != [VALUE] * PIPELINE or int(admitted[0]) != 1:
        raise RuntimeError(f"{client.name} answered {value!r:.40}, {values!r:.40}, "
                           f"{admitted!r:.40}")


@dataclass(frozen=True)
class Sample:
    """One client's turn at one workload and concurrency."""

    workload: str
    concurrency: int
    client: str
    round: int
    calls: int
    cpu_s: float
    wall_s: float

    @property
    def commands(self) -> int:
        return self.calls * COMMANDS[self.workload]

    @property
    def cpu_us(self) -> float:
        """Client CPU per command, in µs."""
        return self.cpu_s * 1e6 / self.commands

    @property
    def rate(self) -> float:
        """Commands per second of wall time."""
        return self.commands / self.wall_s


async def _caller(call: Callable[[int], Awaitable[Any]], first: int, count: int) -> None:
    for i in range(first, first + count):
        await call(i)


async def timed(call: Callable[[int], Awaitable[Any]], concurrency: int, calls: int
                ) -> tuple[float, float]:
    """CPU and wall seconds of ``calls`` calls made by ``concurrency`` callers."""
    each = calls // concurrency
    gc.collect()  # the last turn's garbage is not this one's to collect
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(_caller(call, n * each, each) for n in range(concurrency)))
    return time.process_time() - cpu, time.perf_counter() - wall


@dataclass(frozen=True)
class Plan:
    """How much to measure: calls per turn, per workload and concurrency."""

    rounds: int = 3
    calls: tuple[tuple[str, int, int], ...] = (
        ("admit", 1, 1_500), ("admit", 64, 4_480), ("hget", 1, 2_000), ("hget", 64, 7_680),
        ("pipeline", 1, 600), ("pipeline", 64, 1_280))
    warm: int = 200


QUICK = Plan(rounds=3, calls=tuple((w, c, c * 2) for w in WORKLOADS for c in CONCURRENCY),
             warm=64)


async def measure(url: str, plan: Plan) -> list[Sample]:
    """Every client at every workload and concurrency, ``plan.rounds`` times, interleaved."""
    clients = await candidates(url)
    samples: list[Sample] = []
    try:
        for client in clients:
            await check(client)
            for workload, concurrency, _ in plan.calls:  # warm: every connection opened
                await timed(operation(client, workload), concurrency,
                            max(plan.warm, concurrency))
        gc.collect()
        gc.freeze()  # what is alive now (modules, clients) is not scanned at every turn
        for round_ in range(plan.rounds):
            order = clients[round_ % len(clients):] + clients[:round_ % len(clients)]
            for workload, concurrency, calls in plan.calls:
                for client in order:
                    cpu, wall = await timed(operation(client, workload), concurrency, calls)
                    samples.append(Sample(workload, concurrency, client.name, round_ + 1,
                                          calls - calls % concurrency, cpu, wall))
    finally:
        gc.unfreeze()
        for client in clients:
            await client.close()
    return samples


async def fill(url: str) -> None:
    """The hashes HGET reads."""
    client = RespClient(RedisAddress.from_url(url))
    try:
        await client.pipeline([("FLUSHALL",), *(("HSET", k, "v", VALUE) for k in HASH_KEYS)])
    finally:
        await client.close()


def run(plan: Plan, folder: Path) -> list[Sample]:
    """A redis-server of its own, measured under uvloop, stopped at the end."""
    server, url = start_redis(folder / "redis")
    try:
        uvloop.run(fill(url))
        return uvloop.run(measure(url, plan))
    finally:
        server.stop(grace_s=5)


@dataclass(frozen=True)
class Row:
    """Medians over the rounds of one client at one workload and concurrency."""

    workload: str
    concurrency: int
    client: str
    cpu_us: float
    rate: float
    cpu_ratio: float  # against ferry.resp's at the same workload and concurrency
    rate_ratio: float
    cpu_rounds: list[float]


def rows(samples: Sequence[Sample]) -> list[Row]:
    """A row per workload, concurrency and client, in the order measured."""
    cells: dict[tuple[str, int, str], list[Sample]] = {}
    for sample in samples:
        cells.setdefault((sample.workload, sample.concurrency, sample.client), []).append(sample)
    medians = {key: (statistics.median(s.cpu_us for s in runs),
                     statistics.median(s.rate for s in runs)) for key, runs in cells.items()}
    out = []
    for (workload, concurrency, client), (cpu, rate) in medians.items():
        ref_cpu, ref_rate = medians[(workload, concurrency, REFERENCE)]
        out.append(Row(workload, concurrency, client, cpu, rate, cpu / ref_cpu,
                       rate / ref_rate,
                       [s.cpu_us for s in cells[(workload, concurrency, client)]]))
    return out


def table(found: Sequence[Row]) -> list[str]:
    """The results as a Markdown table."""
    out = ["| workload | concurrency | client | client CPU per command (µs) | commands/s | "
           "CPU / ferry.resp | commands/s / ferry.resp | CPU per command, each round (µs) |",
           "|---|---|---|---|---|---|---|---|"]
    out += [f"| {WORKLOAD_NAMES[r.workload]} | {r.concurrency} | {r.client} | {r.cpu_us:.1f} | "
            f"{r.rate:,.0f} | {r.cpu_ratio:.2f} | {r.rate_ratio:.2f} | "
            f"{' '.join(f'{c:.1f}' for c in r.cpu_rounds)} |" for r in found]
    return out


def verdict(found: Sequence[Row]) -> str:
    """Which client spent the least CPU per command, and the others' ratios to ferry.resp."""
    cells: dict[tuple[str, int], Row] = {}
    for row in found:
        best = cells.get((row.workload, row.concurrency))
        if best is None or row.cpu_us < best.cpu_us:
            cells[(row.workload, row.concurrency)] = row
    wins = collections.Counter(row.client for row in cells.values())
    winner, won = wins.most_common(1)[0]
    others = []
    for client in dict.fromkeys(r.client for r in found if r.client != REFERENCE):
        mine = [r for r in found if r.client == client]
        others.append(f"{client} spent {_span(r.cpu_ratio for r in mine)} times its CPU per "
                      f"command and made {_span(r.rate_ratio for r in mine)} times its commands/s")
    return (f"{winner} spent the least client CPU per command in {won} of {len(cells)} "
            f"rows. Against {REFERENCE}, " + "; ".join(others) + ".")


def _span(ratios: Iterable[float]) -> str:
    values = sorted(ratios)
    return f"{values[0]:.2f}-{values[-1]:.2f}"


def versions() -> str:
    """The clients' versions, as measured."""
    return (f"redis-py {redis.__version__} with hiredis {hiredis.__version__}, "
            f"coredis {coredis.__version__}")


def section(found: Sequence[Row], note: str) -> list[str]:
    """The report's section: how it was measured, the table, and which client won."""
    return [HEADING, "", note, "", *table(found), "", verdict(found)]


def method(plan: Plan) -> str:
    """How the table was measured, in a few sentences."""
    return (f"Each client ({versions()}, and `{REFERENCE}`) as it comes, in one process under "
            "uvloop, against a redis-server of its own on loopback: "
            f"{plan.rounds} interleaved rounds (the clients' order rotated each round), a fixed "
            "number of calls per turn; CPU is the client process's (`time.process_time`), "
            f"per command (a pipeline is {PIPELINE}); medians over the rounds. Concurrency 1: "
            "one caller awaiting each call (light load); 64: 64 tasks sharing one client "
            "(redis-py's pool opens a connection per task, coredis and ferry.resp multiplex). "
            "Run it alone: `python -m loadtest.bench.redis_clients`.")


async def write_section(out: Path, state: Path, quick: bool, command: str,
                        machine: str) -> list[Row]:
    """Measure in a process of its own (its CPU is the clients' alone) and put the section in
    ``out``; every round's samples in ``state``/redis-clients/redis_clients.json."""
    started = datetime.datetime.now(datetime.UTC)
    folder = state / "redis-clients"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    raw = folder / "redis_clients.json"
    with (folder / "run.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadtest.bench.redis_clients", "--json", str(raw),
            *(["--quick"] if quick else []), cwd=ROOT, stdout=log, stderr=log)
        if await proc.wait() != 0:
            raise RuntimeError(f"the Redis clients' bench failed: see {folder / 'run.log'}")
    found = rows([Sample(**s) for s in json.loads(raw.read_text())["samples"]])
    plan = QUICK if quick else Plan()
    note = (f"Measured by `{command}` on {started:%Y-%m-%d %H:%M} UTC ({machine}). "
            + method(plan))
    if quick:
        note = (f"A smoke run of `{command}` on {started:%Y-%m-%d %H:%M} UTC: "
                "two calls per caller a turn. **Not a measurement**: "
                "`python -m loadtest.bench --only redis-clients` measures it.")
    text = out.read_text() if out.exists() else ""
    out.write_text(replace_section(text, section(found, note), HEADING))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.redis_clients",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few calls each: a smoke run")
    parser.add_argument("--json", help="also write every round's samples here")
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ferry-redis-clients-") as folder:
        samples = run(plan, Path(folder))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"versions": versions(), "rounds": plan.rounds,
             "samples": [asdict(s) for s in samples]}))
    found = rows(samples)
    print(f"{versions()}; {plan.rounds} rounds in {time.monotonic() - started:.0f} s")
    print("\n".join(table(found)))
    print(verdict(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
