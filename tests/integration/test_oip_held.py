"""A held infer call, over REST and gRPC, against a real gateway (HTTP and gRPC ports in this
test's event loop) with no batcher, so that its task stays queued for as long as a test needs:
a call past its timeout answers as Triton answers an expired request; a client that goes away
cancels its task; a task cancelled through ``/v1`` ends its held call; with authentication on,
gRPC calls need the credential in their metadata."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from ferry.batcher.worker import Batcher
from ferry.errors import ConfigError
from ferry.planner.profile import refuse_ferry
from ferry.stack.ports import free_port
from ferry.triton.grpc_backend import TritonGrpcBackend
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Served,
    backlog_counts,
    batch_executions,
    batcher_settings,
    executions_counted,
    executions_since,
    gateway_settings,
    serving,
    settled_executions,
    stream_lengths,
    task_keys,
    wait_until,
)
from tests.integration.test_security import ALICE_KEY, KEYS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
ALICE = {"authorization": f"Bearer {ALICE_KEY}"}  # gRPC metadata keys are lower case


@pytest.fixture
async def served(redis_url: str, triton_server: TritonServer) -> AsyncIterator[Served]:
    async with serving(gateway_settings(redis_url, triton_server.grpc_url,
                                        port=free_port())) as ferry:
        yield ferry


SIMPLE = {"inputs": [{"name": name, "shape": [1, 16], "datatype": "FP32",
                      "data": [float(i) for i in range(16)]} for name in ("INPUT0", "INPUT1")]}


def simple_inputs() -> list[InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = InferInput(name, [1, 16], "FP32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


def only_task(store: redis.Redis) -> str:
    (key,) = task_keys(store)
    return key.decode().rsplit(":task:", 1)[1]


async def status_of(ferry: Served, task_id: str) -> str:
    async with httpx.AsyncClient(base_url=ferry.http) as http:
        return str((await http.get(f"/v1/result/{task_id}")).json()["status"])


async def test_a_call_past_its_timeout_answers_as_triton_answers_an_expired_request(
        served: Served, redis_client: redis.Redis) -> None:
    """No batcher runs: each call ends at its deadline, and so does its task (EXPIRED, out of
    its stream and its count), never left to run for nobody."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=served.http, timeout=30) as http:
        late = await http.post("/v2/models/simple/infer",
                               json={**SIMPLE, "parameters": {"timeout": 300_000}})
    rest_s = time.monotonic() - started
    assert late.status_code == 503
    assert late.json() == {"error": "Request timeout expired"}
    started = time.monotonic()
    async with triton_grpc_aio.InferenceServerClient(served.grpc) as client:
        with pytest.raises(InferenceServerException) as expired:
            await client.infer("simple", simple_inputs(), timeout=300_000)
    grpc_s = time.monotonic() - started
    assert expired.value.status() == "StatusCode.UNAVAILABLE"
    assert expired.value.message() == "Request timeout expired"
    assert 0.3 <= rest_s < 3 and 0.3 <= grpc_s < 3  # none held past its deadline for long
    records = [redis_client.hget(key, "status") for key in task_keys(redis_client)]
    assert records == [b"EXPIRED", b"EXPIRED"]
    assert stream_lengths(redis_client) == 0 and backlog_counts(redis_client) == 0


async def _cancelled_when_gone(ferry: Served, store: redis.Redis,
                               call: Callable[[], Awaitable[Any]]) -> None:
    """The client leaves once its call's task is queued (no batcher runs: it stays there),
    not after a fixed time: a loaded machine may take longer than that to admit it."""
    held = asyncio.ensure_future(call())
    deadline = time.monotonic() + 10
    while not task_keys(store):
        assert time.monotonic() < deadline and not held.done(), "the call was never admitted"
        await asyncio.sleep(0.02)
    held.cancel()  # the client goes away: gRPC's stream reset, HTTP's connection closed
    with contextlib.suppress(asyncio.CancelledError):
        await held
    task_id = only_task(store)

    async def cancelled() -> bool:
        return await status_of(ferry, task_id) == "CANCELLED"

    deadline = time.monotonic() + 10
    while not await cancelled():
        assert time.monotonic() < deadline, "the task of a call its client left is not cancelled"
        await asyncio.sleep(0.05)


async def test_a_client_that_goes_away_cancels_its_queued_task(
        served: Served, redis_client: redis.Redis) -> None:
    async with triton_grpc_aio.InferenceServerClient(served.grpc) as client:
        await _cancelled_when_gone(served, redis_client, lambda: client.infer(
            "simple", simple_inputs(), client_timeout=30))
    redis_client.flushall()
    async with httpx.AsyncClient(base_url=served.http, timeout=30) as http:
        await _cancelled_when_gone(served, redis_client, lambda: http.post(
            "/v2/models/simple/infer", json=SIMPLE))


async def test_a_task_cancelled_through_v1_ends_its_held_calls(
        served: Served, redis_client: redis.Redis) -> None:
    async with triton_grpc_aio.InferenceServerClient(served.grpc) as client, \
            httpx.AsyncClient(base_url=served.http, timeout=30) as http:
        for hold in (lambda: client.infer("simple", simple_inputs()),
                     lambda: http.post("/v2/models/simple/infer", json=SIMPLE)):
            redis_client.flushall()
            held = asyncio.ensure_future(hold())
            assert await wait_until(lambda: len(task_keys(redis_client)) == 1, 10)
            assert (await http.delete(f"/v1/result/{only_task(redis_client)}")).status_code == 200
            try:
                answer = await asyncio.wait_for(held, 10)
            except InferenceServerException as exc:
                assert exc.status() == "StatusCode.CANCELLED"
                assert "CANCELLED" in str(exc.message()) or "cancel" in str(exc.message())
            else:
                assert answer.status_code == 400 and "cancel" in answer.json()["error"].lower()


async def test_with_authentication_grpc_calls_need_the_key(
        redis_url: str, triton_server: TritonServer) -> None:
    settings = gateway_settings(redis_url, triton_server.grpc_url, port=free_port(),
                                auth="api_key", api_keys=KEYS, rate_limit_per_min=0)
    async with serving(settings) as ferry, \
            triton_grpc_aio.InferenceServerClient(ferry.grpc) as client:
        assert await client.is_server_live() and await client.is_server_ready()
        with pytest.raises(InferenceServerException) as refused:
            await client.get_model_metadata("sim")
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException) as bad_key:
            await client.infer("simple", simple_inputs(), headers={"x-api-key": "wrong"})
        assert bad_key.value.status() == "StatusCode.UNAUTHENTICATED"
        metadata = await client.get_model_metadata("sim", headers=ALICE, as_json=True)
        assert metadata["name"] == "sim"
        assert (await client.get_model_config("sim", headers={"x-api-key": ALICE_KEY},
                                              as_json=True))["config"]["max_batch_size"] == 64
        accepted = await client.infer("simple", simple_inputs(), headers=ALICE,
                                      parameters={"respond_async": True})
        assert accepted.get_response().parameters["task_id"].string_param
        # the planner's sweep, pointed at this port, is refused as Ferry's, credentials or not
        backend = TritonGrpcBackend(ferry.grpc)
        await backend.start()
        try:
            with pytest.raises(ConfigError, match="is Ferry's gRPC port"):
                await refuse_ferry(backend, ferry.grpc)
        finally:
            await backend.close()


async def test_an_identical_unversioned_call_is_answered_from_the_cache(
        redis_url: str, triton_server: TritonServer) -> None:
    url = triton_server.grpc_url
    async with serving(gateway_settings(redis_url, url, cache_ttl_s=60)) as ferry, \
            httpx.AsyncClient(base_url=ferry.http, timeout=30) as http, \
            triton_grpc_aio.InferenceServerClient(ferry.grpc) as client:
        batcher = Batcher.from_settings(batcher_settings(redis_url, url, max_wait_ms=5))
        await batcher.start()
        try:
            start = batch_executions(url, "simple")
            first = await http.post("/v2/models/simple/infer", json={**SIMPLE, "id": "a"})
            # Triton counts the first's execution after its answer went out: counted first.
            await executions_counted(url, "simple", start, 1)
            before = batch_executions(url, "simple")
            again = await http.post("/v2/models/simple/infer", json={**SIMPLE, "id": "b"})
            over_grpc = await client.infer("simple", simple_inputs(), request_id="c")
            after = await settled_executions(url, "simple")
        finally:
            await batcher.stop()
    assert first.status_code == again.status_code == 200
    assert again.json()["id"] == "b" and again.json()["outputs"] == first.json()["outputs"]
    assert over_grpc.get_response().id == "c"
    np.testing.assert_array_equal(over_grpc.as_numpy("OUTPUT0")[0],
                                  np.arange(16, dtype=np.float32) * 2)
    assert executions_since(before, after) == {}  # both answered from the first's record
