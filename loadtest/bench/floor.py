"""What the machine itself charges for the two things Ferry does most: an HTTP request served by
uvicorn, and a Redis command. Measured in the same run as the benchmark, with the same open-loop
pacing and keep-alive client (``loadtest.rawhttp``) as the sweep's, so the report can tell
Ferry's own cost from the platform's.

The bare exchange is measured at every rate of the fast sweep and at twice it: a client of the
one-request flow makes one exchange per task, one of POST then GET two, and Ferry's CPU per
inference is set against what those exchanges cost alone at the same pace (issue 36's ratio).

On its own it prints what a bare exchange costs this machine, and the ``--cpu-scale`` that
``ferry plan size`` should use for a node like it::

    .venv/bin/python -m loadtest.bench.floor
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import uvloop

from ferry.planner.cpu import BENCH_EXCHANGE_US
from ferry.resp.client import RedisAddress, RespClient
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess
from loadtest.bench.cpu import cpu_seconds
from loadtest.rawhttp import Pool

RATE = 400.0
SECONDS = 4.0
# each rate of the fast sweep up to 1,200/s, and twice each (POST + GET: two exchanges a task)
EXCHANGE_RATES = (50.0, 100.0, 200.0, 400.0, 800.0, 1200.0, 1600.0, 2400.0)


async def trivial_app(scope: dict[str, object], receive: object, send: object) -> None:
    """An ASGI app that answers every request with ``{}``: uvicorn's own cost."""
    if scope["type"] != "http":
        return
    await receive()  # type: ignore[operator]
    await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]


async def _paced(call: object, rate: float = RATE, seconds: float = SECONDS) -> int:
    count = int(rate * seconds)
    start = time.perf_counter()
    pending = []
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.ensure_future(call()))  # type: ignore[operator]
    await asyncio.gather(*pending)
    return count


REDIS_FLOOR = f"a Redis command (HSET) for redis-server, at {RATE:,.0f}/s"


def exchange_name(rate: float) -> str:
    """The report's name of a bare exchange at ``rate``."""
    return (f"a bare HTTP exchange (uvicorn, httptools, uvloop, answering {{}} at once) at "
            f"{rate:,.0f}/s")


async def http_floors(rates: tuple[float, ...] = EXCHANGE_RATES) -> dict[float, float]:
    """uvicorn (httptools, uvloop) CPU per request for a trivial app, at each of ``rates``
    requests/s (one server, one keep-alive pool, the rates in turn)."""
    port = free_port()
    server = ManagedProcess("uvicorn", [sys.executable, "-m", "uvicorn",
                                        "loadtest.bench.floor:trivial_app", "--port", str(port),
                                        "--host", LOOPBACK, "--loop", "uvloop", "--http",
                                        "httptools", "--no-access-log", "--log-level", "warning"])
    server.start()
    found: dict[float, float] = {}
    try:
        server.wait_ready(lambda: http_ok(f"http://{LOOPBACK}:{port}/"), 30)
        pool = Pool(LOOPBACK, port)
        for rate in rates:
            before = cpu_seconds(server.pid or 0)
            count = await _paced(lambda: pool.request("POST", "/", b'{"input": "x"}'), rate)
            found[rate] = (cpu_seconds(server.pid or 0) - before) * 1e6 / count
        await pool.close()
    finally:
        server.stop(grace_s=5)
    return found


async def redis_floor(redis_url: str, redis_pid: int) -> float:
    """redis-server CPU per command (a small HSET) at RATE commands/s."""
    client = RespClient(RedisAddress.from_url(redis_url))
    try:
        await client.execute("PING")
        before = cpu_seconds(redis_pid)
        count = await _paced(lambda: client.execute("HSET", "ferry:bench:floor", "f", "v"))
        used = cpu_seconds(redis_pid) - before
        await client.execute("DEL", "ferry:bench:floor")
    finally:
        await client.close()
    return used * 1e6 / count


def main() -> None:
    """Print what a bare exchange costs on this machine: the figure ``ferry plan size
    --cpu-scale`` wants, over ``BENCH_EXCHANGE_US`` (docs/cli.md)."""
    parser = argparse.ArgumentParser(description="What a bare HTTP exchange (uvicorn answering "
                                     "{} at once) costs this machine's CPU, at each rate.")
    parser.add_argument("--rates", default="400", help="requests/s, comma-separated")
    args = parser.parse_args()
    rates = tuple(float(r) for r in args.rates.split(","))
    found = uvloop.run(http_floors(rates))
    for rate, used in found.items():
        print(f"{exchange_name(rate)}: {used:,.0f} us of server CPU each")
    if RATE in found:
        print(f"ferry plan size --cpu-scale {found[RATE] / BENCH_EXCHANGE_US:.2f} "
              f"(against {BENCH_EXCHANGE_US:,.0f} us where its CPU costs were measured)")


if __name__ == "__main__":
    main()
