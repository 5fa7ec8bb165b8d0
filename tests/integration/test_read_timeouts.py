"""Clients that stall, against a real gateway on a real port (served as ``ferry gateway`` serves
it): a body that stops arriving and headers that never end are answered 408 within their
timeouts, the connection is closed and nothing is enqueued, on every kind of route; an upload
that keeps sending is never cut however long it takes; a connection that sends nothing is closed.
And what a request sends is echoed back in an error only cut short."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.utils import InferenceServerException

from ferry.errors import MAX_ECHO, MAX_MESSAGE
from ferry.stack.ports import LOOPBACK, free_port
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Served,
    gateway_settings,
    serving,
    stream_lengths,
    task_keys,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

HEADER_S, BODY_S = 0.6, 0.4  # apart, so that an answer shows which timeout gave it
ADMIN_TOKEN = "an-admin-token-of-at-least-24-characters"
LONG = "x" * 5000


@pytest.fixture
async def served(redis_url: str, triton_server: TritonServer,
                 tmp_path: Path) -> AsyncIterator[Served]:
    settings = gateway_settings(redis_url, triton_server.grpc_url, port=free_port(),
                                header_timeout_s=HEADER_S, body_timeout_s=BODY_S,
                                job_store_dir=str(tmp_path), admin_token=ADMIN_TOKEN)
    async with serving(settings) as ferry:
        yield ferry


async def connect(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = int(served.http.rsplit(":", 1)[1])
    return await asyncio.open_connection(LOOPBACK, port)


async def answer_and_close(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """The answer the gateway sends before it closes the connection (EOF within 5 s)."""
    raw = await asyncio.wait_for(reader.read(), 5)  # to EOF: the gateway closed
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines[0] else 0
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return status, headers, body


# (path, headers) of a route of each kind: the hot lane, the protocol's REST infer (FastAPI),
# a job's streamed upload, an admin PUT.
ROUTES = [
    ("/v1/inference?model=sim", "Content-Type: application/octet-stream"),
    ("/v2/models/sim/infer", "Content-Type: application/json"),
    ("/v1/jobs?model=sim", "Content-Type: application/x-ndjson"),
    ("/v1/admin/rollouts/sim", f"Content-Type: application/json\r\n"
                               f"Authorization: Bearer {ADMIN_TOKEN}"),
]


@pytest.mark.parametrize(("path", "headers"), ROUTES, ids=["hot", "v2", "jobs", "admin"])
async def test_a_body_that_stops_arriving_is_answered_408_and_closed(
        served: Served, redis_client: redis.Redis, path: str, headers: str) -> None:
    reader, writer = await connect(served)
    method = "PUT" if "admin" in path else "POST"
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: ferry\r\n{headers}\r\n"
                 "Content-Length: 1000\r\n\r\nhello".encode())
    started = time.monotonic()
    status, answer_headers, body = await answer_and_close(reader)
    waited = time.monotonic() - started
    writer.close()
    assert status == 408, body
    assert json.loads(body)["error"]["code"] == "body_timeout"
    assert answer_headers["connection"] == "close"
    assert BODY_S * 0.9 <= waited < BODY_S + 2, waited
    assert stream_lengths(redis_client) == 0 and not task_keys(redis_client)
    if "inference" in path:  # the hot lane counts it as its refusal
        async with httpx.AsyncClient(base_url=served.http) as client:
            metrics = (await client.get("/metrics")).text
        assert 'ferry_requests_rejected_total{reason="body_timeout",status="408"} 1.0' in metrics


async def test_a_chunked_body_that_stops_mid_chunk_is_answered_408(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(b"POST /v1/inference?model=sim HTTP/1.1\r\nHost: ferry\r\n"
                 b"Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"5\r\nhello\r\n10\r\nabc")
    status, _, body = await answer_and_close(reader)
    writer.close()
    assert status == 408 and json.loads(body)["error"]["code"] == "body_timeout"


async def test_headers_that_never_end_are_answered_408_even_sent_a_byte_at_a_time(
        served: Served) -> None:
    """The header timeout is a total from the first byte: a client trickling bytes (slowloris)
    is cut as surely as one that stops."""
    reader, writer = await connect(served)
    started = time.monotonic()

    async def trickle() -> None:
        for byte in b"POST /v1/inference?model=sim HTTP/1.1\r\nHost: ferry\r\nX-Slow: aaaaaaaa":
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)  # pacing: a byte every 50 ms, each within any timeout

    trickling = asyncio.ensure_future(trickle())
    status, _, body = await answer_and_close(reader)
    waited = time.monotonic() - started
    trickling.cancel()
    writer.close()
    assert status == 408, body
    error = json.loads(body)["error"]
    assert error["code"] == "header_timeout" and f"{HEADER_S:g} s" in error["message"]
    assert HEADER_S * 0.9 <= waited < HEADER_S + 2, waited
    async with httpx.AsyncClient(base_url=served.http) as client:
        metrics = (await client.get("/metrics")).text
    assert 'ferry_requests_rejected_total{reason="header_timeout",status="408"} 1.0' in metrics


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer(
        served: Served) -> None:
    reader, writer = await connect(served)
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert HEADER_S * 0.9 <= time.monotonic() - started < HEADER_S + 2
    writer.close()


async def test_an_upload_that_keeps_sending_is_never_cut(served: Served) -> None:
    """Ten pieces, each after a pause under the body timeout: the whole takes three body
    timeouts, and is accepted. Then the connection serves another request (kept alive)."""
    pieces = [b"0123456789"] * 10
    reader, writer = await connect(served)
    writer.write(b"POST /v1/inference?model=sim HTTP/1.1\r\nHost: ferry\r\n"
                 b"Content-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n")
    started = time.monotonic()
    for piece in pieces:
        await asyncio.sleep(BODY_S * 0.3)  # pacing: a pause under the body timeout
        writer.write(piece)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 202"), head
    assert time.monotonic() - started > BODY_S * 2.5
    length = int(re.search(rb"content-length: (\d+)", head, re.I)[1])  # type: ignore[index]
    assert "task_id" in json.loads(await reader.readexactly(length))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: ferry\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)).startswith(b"HTTP/1.1 200")
    writer.close()


def short(response: httpx.Response) -> str:
    message: str = response.json()["error"]
    if isinstance(message, dict):  # /v1's body; /v2's is Triton's {"error": "..."}
        message = message["message"]
    assert len(response.content) < 300 + MAX_ECHO, response.text[:300]
    assert "x" * (MAX_ECHO + 1) not in message and len(message) <= MAX_MESSAGE + 1
    return message


async def test_what_a_request_sent_is_echoed_cut_short(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.http, headers={
            "authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        for method, path in [("GET", f"/v1/result/{LONG}"), ("DELETE", f"/v1/result/{LONG}"),
                             ("GET", f"/v1/jobs/{LONG}"), ("GET", f"/v2/models/{LONG}"),
                             ("GET", f"/v1/admin/rollouts/{LONG}")]:
            response = await client.request(method, path)
            assert response.status_code == 404, (path[:30], response.status_code)
            assert "xxxx…" in short(response), path[:30]
        response = await client.get(f"/v2/models/sim/versions/{LONG}")
        assert response.status_code == 404 and short(response)  # not echoed at all
        response = await client.post(f"/v1/inference?model={LONG}", content=b"a",
                                     headers={"content-type": "text/plain"})
        assert response.status_code in (400, 404) and short(response)
        response = await client.post(f"/v1/jobs?model={LONG}", content=b'{"input": "a"}\n',
                                     headers={"content-type": "application/x-ndjson"})
        assert response.status_code in (400, 404) and short(response)
        response = await client.post("/v1/inference?model=sim", content=b"a", headers={
            "content-type": "text/plain", "x-request-timeout": LONG})
        assert response.status_code == 400 and short(response)
        response = await client.post("/v1/inference", json={"model": "sim", "input": "a",
                                                            LONG: 1})
        assert response.status_code == 400 and short(response)


async def test_what_a_grpc_call_sent_is_echoed_cut_short(served: Served) -> None:
    client = triton_grpc_aio.InferenceServerClient(served.grpc)
    try:
        with pytest.raises(InferenceServerException) as refused:
            await client.get_model_metadata(LONG)
    finally:
        await client.close()
    message = refused.value.message() or ""
    assert "xxxx…" in message and "x" * (MAX_ECHO + 1) not in message, message[:200]


async def test_a_grpc_connection_that_never_begins_is_closed(served: Served) -> None:
    """The gRPC port's equivalent of the header timeout: no HTTP/2 preface within it."""
    host, port = served.grpc.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    while await asyncio.wait_for(reader.read(65536), 5):
        pass
    assert HEADER_S * 0.9 <= time.monotonic() - started < HEADER_S + 2
    writer.close()
