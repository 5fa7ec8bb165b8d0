"""The read timeouts' protocol on its own (no server; tests/integration/test_read_timeouts.py
has them on a real port): time the gateway holds reading back is not a client's stall, and a
request read whole never arms a timer."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.server import ServerState

from ferry.gateway.timeouts import STATE_KEY, TIMED_OUT, ReadTimeouts, TimedHttpToolsProtocol

BODY_S = 0.05
BIG = 256 * 1024  # past uvicorn's buffer (64 KiB): reading pauses until the route reads


class Transport(asyncio.Transport):
    """A connection's far end: what the protocol wrote, whether it closed, whether it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5555)}.get(name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Route:
    """Reads the body when told to, then answers 200."""

    def __init__(self) -> None:
        self.read = asyncio.Event()
        self.received = 0
        self.scope: Scope = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        await self.read.wait()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            self.received += len(message["body"])
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def connection(route: Route) -> tuple[TimedHttpToolsProtocol, Transport]:
    config = Config(route, lifespan="off", log_level="warning")
    config.load()
    protocol = TimedHttpToolsProtocol(config, ServerState(),
                                      {STATE_KEY: ReadTimeouts(BODY_S, BODY_S)})
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


def request(length: int) -> bytes:
    return (b"POST /v1/jobs HTTP/1.1\r\nHost: ferry\r\nContent-Length: %d\r\n\r\n" % length)


async def test_a_body_held_back_by_the_gateway_is_not_a_stall() -> None:
    route = Route()
    protocol, transport = connection(route)
    protocol.data_received(request(BIG + 10) + b"x" * BIG)
    assert transport.paused  # the route has not read: uvicorn stops reading the socket
    # A body timer armed by now (due in BODY_S) would have run before this sleep ends: the loop
    # runs its timers in order of their due time, however slow the machine.
    await asyncio.sleep(BODY_S * 4)
    assert not transport.closed
    route.read.set()
    await asyncio.sleep(0)
    assert not transport.paused and route.received == BIG
    await asyncio.sleep(BODY_S * 3)  # the client owes 10 bytes and sends none: the timer runs
    assert transport.closed and transport.written.startswith(b"HTTP/1.1 408 ")
    assert route.scope[TIMED_OUT] == "body_timeout"


async def test_a_request_read_whole_arms_no_timer() -> None:
    route = Route()
    route.read.set()
    protocol, transport = connection(route)
    assert protocol.timer is not None  # the connection's first request is awaited
    protocol.timer.cancel()
    protocol.timer = None
    protocol.data_received(request(5) + b"hello")
    assert protocol.timer is None
    await asyncio.sleep(BODY_S * 2)  # past any body timer's due time (run in order, as above)
    assert transport.written.startswith(b"HTTP/1.1 200 ") and not transport.closed
    protocol.connection_lost(None)
