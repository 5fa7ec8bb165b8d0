"""What the machine itself charges for the two things Ferry does most: an HTTP request served by
uvicorn, and a Redis command. Measured in the same run as the benchmark, with the same open-loop
pacing, so the report can tell Ferry's own cost from the platform's."""

from __future__ import annotations

import asyncio
import sys
import time

from ferry.resp.client import RedisAddress, RespClient
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess
from loadtest.bench.cpu import cpu_seconds
from loadtest.rawhttp import Pool

RATE = 400.0
SECONDS = 4.0


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


async def http_floor() -> float:
    """uvicorn (httptools, uvloop) CPU per request for a trivial app, at RATE requests/s."""
    port = free_port()
    server = ManagedProcess("uvicorn", [sys.executable, "-m", "uvicorn",
                                        "loadtest.bench.floor:trivial_app", "--port", str(port),
                                        "--host", LOOPBACK, "--loop", "uvloop", "--http",
                                        "httptools", "--no-access-log", "--log-level", "warning"])
    server.start()
    try:
        server.wait_ready(lambda: http_ok(f"http://{LOOPBACK}:{port}/"), 30)
        pool = Pool(LOOPBACK, port)
        before = cpu_seconds(server.pid or 0)
        count = await _paced(lambda: pool.request("POST", "/", b'{"input": "x"}'))
        used = cpu_seconds(server.pid or 0) - before
        await pool.close()
    finally:
        server.stop(grace_s=5)
    return used * 1e6 / count


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
