"""A minimal keep-alive HTTP/1.1 client on asyncio streams, for load generation.

httpx spends about a millisecond of CPU per request; on a 2-core machine that makes the load
generator, not the server, the bottleneck. This client does only what the load test needs:
GET/POST with a body, Content-Length responses, connections reused from a pool.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

# Servers close idle keep-alive connections (uvicorn after 5 s): never reuse one idle this long.
MAX_IDLE_S = 3.0


class Response:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Pool:
    """Reusable connections to one host:port; a new one is opened when none is idle."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self._all: list[asyncio.StreamWriter] = []

    async def request(self, method: str, path: str, body: bytes = b"",
                      content_type: str = "application/json") -> Response:
        reader, writer = await self._checkout()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
        writer.write(head.encode() + body)
        try:
            response = await _read_response(reader)
        except BaseException:
            writer.close()
            raise
        self._idle.append((reader, writer, time.monotonic()))
        return response

    async def _checkout(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer, since = self._idle.pop()
            if time.monotonic() - since < MAX_IDLE_S and not reader.at_eof():
                return reader, writer
            writer.close()
        return await self._connect()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self._all.append(writer)
        return reader, writer

    async def close(self) -> None:
        for writer in self._all:
            writer.close()
        self._all.clear()
        self._idle.clear()


async def _read_response(reader: asyncio.StreamReader) -> Response:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return Response(status, await reader.readexactly(length))
