"""A batcher's own small HTTP endpoint: ``/metrics`` (Prometheus), ``/healthz`` (liveness) and
``/readyz`` (readiness), on ``metrics_port``, served on the batcher's event loop.

A check answers ``(ok, details)``: 200 or 503 with the details as JSON. Requests are bounded
(one line and headers, 8 KiB, 5 s) and every connection is closed after its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Check = Callable[[], tuple[bool, dict[str, str]]]
MAX_HEAD = 8192
READ_TIMEOUT_S = 5.0


class StatusServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, *,
                 live: Check, ready: Check) -> None:
        self.host, self.port = host, port
        self.registry = registry
        self.checks = {"/healthz": live, "/readyz": ready}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=MAX_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def answer(self, method: str, path: str) -> tuple[int, bytes, str]:
        """Status, body and content type for a request line."""
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, b'{"error": "GET only"}', "application/json"
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        check = self.checks.get(path)
        if check is None:
            return 404, b'{"error": "/metrics, /healthz or /readyz"}', "application/json"
        ok, details = check()
        return (200 if ok else 503), orjson.dumps({"ok": ok, **details}), "application/json"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            status, body, kind = self.answer(method, path)
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
                      503: "Service Unavailable"}[status]
            writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError, ConnectionError):
            pass  # a client that does not speak HTTP, or went away: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
