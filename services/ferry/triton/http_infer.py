"""Triton's infer call over HTTP/1.1 with the binary tensor data extension: the batcher's data
plane when ``FERRY_TRITON_HTTP_URL`` is set (control calls stay on gRPC).

Python's gRPC costs about 450 µs of CPU per call on this project's 2-core machine (its C core
hands every reply across two threads before the event loop sees it); a request on a kept-alive
HTTP/1.1 connection, written and read on the event loop itself, costs about 100 µs
(docs/performance.md). The tensors travel as raw bytes after the JSON header, exactly the raw
contents gRPC would carry (``ferry.triton.tensors``), so both planes answer alike.

Pure apart from ``HttpInferClient``: the body builders and the reply parser are unit-tested.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ferry.errors import (
    BackendError,
    PermanentBackendError,
    TransientBackendError,
    UnknownModelError,
)
from ferry.tensors import Tensor

HEADER_LENGTH = "inference-header-content-length"
_TRANSIENT_STATUS = frozenset({408, 429, 499, 502, 503, 504})
_HEAD_LIMIT = 1 << 16


@dataclass(frozen=True)
class InferReply:
    """A reply's outputs, as they came (not yet checked against their shapes)."""

    model_name: str
    model_version: str
    outputs: tuple[Tensor, ...]


@dataclass(frozen=True)
class InferBody:
    """A request's JSON header and the binary blobs that follow it."""

    header: bytes
    blobs: tuple[bytes, ...]

    @property
    def length(self) -> int:
        return len(self.header) + sum(len(b) for b in self.blobs)


def infer_path(model: str, version: str = "") -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}/infer" if version else f"{path}/infer"


def bytes_batch_body(input_name: str, raw: bytes, rows: int, outputs: Sequence[str]) -> InferBody:
    """The batch of Ferry's contract: one [rows, 1] BYTES input (``raw``: its elements, each
    after its length), every output asked for in binary."""
    header = {"inputs": [{"name": input_name, "datatype": "BYTES", "shape": [rows, 1],
                          "parameters": {"binary_data_size": len(raw)}}],
              "outputs": [{"name": name, "parameters": {"binary_data": True}}
                          for name in outputs]}
    return InferBody(_json(header), (raw,))


def tensor_body(inputs: Sequence[Tensor], outputs: Sequence[str] = (),
                request_id: str = "") -> InferBody:
    """A tensor batch: every input's raw contents; the outputs asked for (none: all), binary."""
    header: dict[str, Any] = {
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape),
                    "parameters": {"binary_data_size": len(t.raw)}} for t in inputs]}
    if request_id:
        header["id"] = request_id
    if outputs:
        header["outputs"] = [{"name": name, "parameters": {"binary_data": True}}
                             for name in outputs]
    else:
        header["parameters"] = {"binary_data_output": True}
    return InferBody(_json(header), tuple(t.raw for t in inputs))


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def parse_reply(body: bytes, header_length: int | None, what: str) -> InferReply:
    """An infer reply: the JSON header (all of ``body`` without ``header_length``), then each
    output's binary contents in order."""
    split = len(body) if header_length is None else header_length
    if split > len(body):
        raise PermanentBackendError(f"{what}: reply header longer than the reply")
    try:
        header = json.loads(body[:split])
        entries = list(header.get("outputs", []))
    except (ValueError, AttributeError, TypeError) as exc:
        raise PermanentBackendError(f"{what}: reply is not Triton's infer JSON: {exc}") from exc
    pos, outputs = split, []
    for entry in entries:
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            raise PermanentBackendError(f"{what}: output {entry.get('name')!r} came as JSON, "
                                        "not binary")
        size = int(size)
        if pos + size > len(body):
            raise PermanentBackendError(f"{what}: output {entry.get('name')!r} truncated")
        outputs.append(Tensor(str(entry["name"]), str(entry["datatype"]),
                              tuple(int(d) for d in entry.get("shape", [])),
                              body[pos:pos + size]))
        pos += size
    return InferReply(str(header.get("model_name", "")), str(header.get("model_version", "")),
                      tuple(outputs))


def refusal(status: int, body: bytes, what: str) -> BackendError:
    """A non-200 reply as Ferry's error: 404 or an unknown model, transient statuses (408, 429,
    499, 502-504), and the rest permanent; the server's message kept."""
    try:
        message = str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    code = f"HTTP {status}"
    text = f"{what}: {code}: {message}"
    if status == 404 or "unknown model" in message.lower():
        return UnknownModelError(text, code=code, reason=message)
    if status in _TRANSIENT_STATUS:
        return TransientBackendError(text, code=code, reason=message)
    return PermanentBackendError(text, code=code, reason=message)


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used: bool = False  # has answered a request: may have been closed by the server since

    def close(self) -> None:
        self.writer.close()


class _Stale(Exception):
    """A kept-alive connection closed before it answered: send again on a new one."""


class HttpInferClient:
    """Infer calls to one Triton's HTTP endpoint over kept-alive connections (one per call in
    flight; idle ones kept for the next)."""

    def __init__(self, url: str, *, timeout_s: float,
                 ssl_context: ssl.SSLContext | None = None, server_name: str = "") -> None:
        hostport = url.removeprefix("http://").removeprefix("https://").rstrip("/")
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Triton HTTP address must be host:port, is {url!r}")
        self.host, self.port = host.strip("[]"), int(port)
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self.server_name = server_name or None  # TLS: the name to verify (an address's own)
        self._idle: list[_Conn] = []
        self._head_host = f"Host: {hostport}\r\n".encode()

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def infer(self, model: str, version: str, body: InferBody) -> InferReply:
        what = f"infer {model!r}"
        try:
            async with asyncio.timeout(self.timeout_s):
                status, length, payload = await self._exchange(infer_path(model, version), body)
        except TimeoutError as exc:
            raise TransientBackendError(f"{what}: no answer in {self.timeout_s:g} s",
                                        code="DEADLINE_EXCEEDED") from exc
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as exc:
            raise TransientBackendError(f"{what}: {type(exc).__name__}: {exc}",
                                        code="UNAVAILABLE", reason=str(exc)) from exc
        if status != 200:
            raise refusal(status, payload, what)
        return parse_reply(payload, length, what)

    async def _exchange(self, path: str, body: InferBody) -> tuple[int, int | None, bytes]:
        conn = await self._connection()
        try:
            answer = await self._send(conn, path, body)
        except _Stale:
            conn.close()
            conn = await self._open()
            answer = await self._send(conn, path, body)
        except BaseException:
            conn.close()
            raise
        status, headers, payload = answer
        if headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            conn.used = True
            self._idle.append(conn)
        length = headers.get(HEADER_LENGTH)
        return status, int(length) if length is not None else None, payload

    async def _connection(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                return conn
            conn.close()
        return await self._open()

    async def _open(self) -> _Conn:
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.ssl_context, limit=_HEAD_LIMIT,
            server_hostname=self.server_name if self.ssl_context is not None else None)
        return _Conn(reader, writer)

    async def _send(self, conn: _Conn, path: str,
                    body: InferBody) -> tuple[int, dict[str, str], bytes]:
        head = (f"POST {path} HTTP/1.1\r\n".encode() + self._head_host
                + b"Content-Type: application/octet-stream\r\n"
                + f"Inference-Header-Content-Length: {len(body.header)}\r\n"
                  f"Content-Length: {body.length}\r\n\r\n".encode())
        conn.writer.writelines([head, body.header, *body.blobs])
        try:
            await conn.writer.drain()
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            if conn.used:
                raise _Stale() from exc
            raise
        return await _read_reply(conn.reader, head)


async def _read_reply(reader: asyncio.StreamReader,
                      head: bytes) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of a reply whose head (status line and headers, through the
    blank line) was read."""
    status_line, _, rest = head.partition(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP reply: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in rest.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return int(parts[1]), headers, await _read_chunked(reader)
    return int(parts[1]), headers, await reader.readexactly(int(headers.get("content-length",
                                                                            "0")))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # the empty trailer
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)
