"""A minimal keep-alive HTTP/1.1 client on asyncio protocols, for load generation.

httpx spends about a millisecond of CPU per request; on a 2-core machine that makes the load
generator, not the server, the bottleneck. This client does only what load tests need: one request
at a time per connection, bodies with Content-Length, responses parsed by httptools (C),
connections reused from a pool.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any, cast

import httptools

# Servers close idle keep-alive connections (uvicorn after 5 s): never reuse one idle this long.
MAX_IDLE_S = 3.0


class Response:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiting: asyncio.Future[Response] | None = None
        self.body: list[bytes] = []
        self.closed = False
        self.keep_alive = True  # the last response let the connection be reused
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError(f"server closed the connection: {exc}"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        waiting, self.waiting = self.waiting, None
        body, self.body = b"".join(self.body), []
        self.keep_alive = self.parser.should_keep_alive()  # no "Connection: close"
        if waiting is not None and not waiting.done():
            waiting.set_result(Response(self.parser.get_status_code(), body))

    def _fail(self, exc: Exception) -> None:
        waiting, self.waiting = self.waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_exception(exc)

    def send(self, data: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None
        self.waiting = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiting

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Reusable connections to one host:port; a new one is opened when none is idle."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[_Connection] = []
        self._all: list[_Connection] = []

    async def request(self, method: str, path: str, body: bytes = b"",
                      content_type: str = "application/json",
                      headers: Sequence[tuple[str, str]] = ()) -> Response:
        connection = await self._checkout()
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}\r\n")
        try:
            response = await connection.send(head.encode() + body)
        except BaseException:
            connection.close()
            raise
        if not connection.keep_alive:  # the server closes it: never send on it again
            connection.close()
            return response
        connection.idle_since = time.monotonic()
        self._idle.append(connection)
        return response

    async def _checkout(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and time.monotonic() - connection.idle_since < MAX_IDLE_S:
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(_Connection, self.host, self.port)
        self._all.append(connection)
        return connection

    async def close(self) -> None:
        for connection in self._all:
            connection.close()
        self._all.clear()
        self._idle.clear()
