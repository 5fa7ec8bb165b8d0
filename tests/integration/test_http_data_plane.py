"""The batcher's infer calls over Triton's HTTP endpoint (``FERRY_TRITON_HTTP_URL``), against
the real Redis and tritonserver: the same answers as over gRPC, batched alike, Triton's refusals
translated, and kept-alive connections that the server closed opened again."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from ferry.errors import PermanentBackendError, TransientBackendError, UnknownModelError
from ferry.stack.ports import LOOPBACK, free_port
from ferry.tensors import Tensor, pack_bytes, unpack_bytes
from ferry.triton.http_infer import HttpInferClient, bytes_batch_body, tensor_body
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    executions_since,
    gateway_settings,
    running_stack,
    wait_until,
)
from tests.integration.test_batching import expected_output
from tests.integration.test_tensor_batching import admit_all, outputs_of, random_rows, simple_task

pytestmark = [pytest.mark.integration]


def http_address(triton_server: TritonServer) -> str:
    return f"{LOOPBACK}:{triton_server.ports.http}"


async def test_bytes_batches_over_http_answer_as_over_grpc_in_few_calls(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    payloads = [f"over-http-{i}-{'y' * (i % 13)}".encode() for i in range(120)]
    async with running_stack(gateway_settings(redis_url, url), batcher_settings(
            redis_url, url, triton_http_url=http_address(triton_server))) as stack:
        results = await stack.results(await asyncio.gather(*(stack.submit(p)
                                                             for p in payloads)))
        registry = stack.batchers[0].metrics.registry
    assert [r["output"] for r in results] == [expected_output(p) for p in payloads]
    assert {r["model_version"] for r in results} == {"1"}
    executed = executions_since(before, batch_executions(url, "sim"))
    assert sum(size * n for size, n in executed.items()) == len(payloads)
    assert sum(executed.values()) < len(payloads) / 2, f"batches too small: {executed}"
    assert registry.get_sample_value("ferry_batch_size_sum",
                                     {"model": "sim", "version": "1"}) == len(payloads)


async def test_tensor_batches_over_http_give_every_request_its_rows(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url, rng = triton_server.grpc_url, np.random.default_rng(8)
    pairs = [(random_rows(rng, n), random_rows(rng, n)) for n in rng.integers(1, 4, 12)]
    asked = [("OUTPUT1",) if i % 3 == 0 else () for i in range(len(pairs))]
    async with running_stack(gateway_settings(redis_url, url), batcher_settings(
            redis_url, url, triton_http_url=http_address(triton_server), max_wait_ms=300,
            adaptive_flush=False)) as stack:
        results = await admit_all(stack, [simple_task(a, b, outputs) for (a, b), outputs
                                          in zip(pairs, asked, strict=True)])
    for (a, b), outputs, result in zip(pairs, asked, results, strict=True):
        out = outputs_of(result)
        assert sorted(out) == (["OUTPUT1"] if outputs else ["OUTPUT0", "OUTPUT1"])
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        if not outputs:
            np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        assert result["model_version"] == "1" and result["output"]["id"] == f"r-{a.shape[0]}"


async def test_the_client_answers_as_triton_does_and_translates_its_refusals(
    triton_server: TritonServer,
) -> None:
    client = HttpInferClient(http_address(triton_server), timeout_s=10)
    try:
        raw = pack_bytes([b"first", b"second"])
        reply = await client.infer("sim", "1", bytes_batch_body("INPUT", raw, 2, ["OUTPUT"]))
        (output,) = reply.outputs
        assert reply.model_version == "1" and output.shape == (2, 1)
        assert [json.loads(e) for e in unpack_bytes(output.raw)] == [
            expected_output(b"first")["OUTPUT"], expected_output(b"second")["OUTPUT"]]
        with pytest.raises(UnknownModelError, match="no_such_model"):
            await client.infer("no_such_model", "", bytes_batch_body("INPUT", raw, 2, []))
        short = Tensor("INPUT0", "FP32", (1, 16), bytes(60))  # a float short of its shape
        with pytest.raises(PermanentBackendError, match="HTTP 400") as refused:
            await client.infer("simple", "", tensor_body(
                [short, Tensor("INPUT1", "FP32", (1, 16), bytes(64))]))
        assert not isinstance(refused.value, UnknownModelError) and refused.value.reason
        assert len(client._idle) == 1  # one connection served every call, refusals included
    finally:
        await client.close()


async def test_nothing_listening_is_transient() -> None:
    client = HttpInferClient(f"{LOOPBACK}:{free_port()}", timeout_s=5)
    with pytest.raises(TransientBackendError, match=r"UNAVAILABLE|refused|Connect"):
        await client.infer("sim", "", bytes_batch_body("INPUT", pack_bytes([b"x"]), 1, []))


async def test_a_kept_alive_connection_the_server_closed_is_opened_again(
    triton_server: TritonServer,
) -> None:
    """A proxy in front of Triton that answers one request per connection and drops the next
    unanswered (a server's idle timeout racing a new request), or closes at once: no call may
    fail. Each call is made once the proxy has closed or parked the last call's connection."""
    connections = settled = 0

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(LOOPBACK, triton_server.ports.http)
        up_writer.write(await read_message(reader))
        writer.write(await read_message(up_reader))
        await writer.drain()
        up_writer.close()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections, settled
        connections += 1
        await forward(reader, writer)
        if connections % 2 == 0:
            writer.close()
            settled += 1
            return
        settled += 1
        await reader.readuntil(b"\r\n\r\n")  # the next request arrives: dropped
        writer.close()

    server = await asyncio.start_server(proxy, LOOPBACK, 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpInferClient(f"{LOOPBACK}:{port}", timeout_s=10)
    calls = 0

    def caught_up() -> bool:  # the proxy has closed or parked the last call's connection
        return settled == calls

    try:
        for i in range(6):
            reply = await client.infer("sim", "", bytes_batch_body(
                "INPUT", pack_bytes([f"again-{i}".encode()]), 1, ["OUTPUT"]))
            assert reply.outputs[0].shape == (1, 1)
            calls += 1
            assert await wait_until(caught_up, 5, interval_s=0.005)
        assert connections >= 6
    finally:
        await client.close()
        server.close()


async def read_message(reader: asyncio.StreamReader) -> bytes:
    """One HTTP message with a Content-Length body, as it came."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)
