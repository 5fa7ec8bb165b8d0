"""Idempotency-Key against a real Redis and Triton: a repeat gets the first request's task, also
when the repeats race; the same key with another body is a 422."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
import redis

from tests.conftest import TritonServer
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    executions_since,
    gateway_settings,
    pending_count,
    running_gateway,
    running_stack,
    stream_lengths,
    task_keys,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


async def post(client: httpx.AsyncClient, text: str, key: str | None, *,
               client_id: str = "alice", wait: bool = False) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    if wait:
        headers["Prefer"] = "wait=10"
    body = orjson.dumps({"model": "sim", "input": text, "client_id": client_id})
    return await client.post("/v1/inference", content=body, headers=headers)


async def test_a_repeat_gets_the_first_requests_task(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        first = await post(client, "pay 10", "order-1")
        again = await post(client, "pay 10", "order-1")
        other_client = await post(client, "pay 10", "order-1", client_id="bob")
        no_key = await post(client, "pay 10", None)
    assert first.status_code == again.status_code == 202
    assert again.json()["task_id"] == first.json()["task_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert other_client.json()["task_id"] != first.json()["task_id"]  # keys are per client
    assert no_key.json()["task_id"] != first.json()["task_id"]
    assert len(task_keys(redis_client)) == 3  # (the identical ones share an inference)


async def test_concurrent_repeats_create_one_task_and_one_inference(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        answers = await asyncio.gather(*(post(stack.client, "once", "k-42", wait=True)
                                         for _ in range(20)))
    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["task_id"] for a in answers}) == 1
    assert {a.json()["status"] for a in answers} == {"SUCCESS"}
    executed = executions_since(before, batch_executions(url, "sim"))
    assert sum(size * n for size, n in executed.items()) == 1


async def test_the_same_key_with_another_body_is_a_422(
    redis_url: str, triton_server: TritonServer,
) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        first = await post(client, "pay 10", "order-2")
        changed = await post(client, "pay 1000", "order-2")
    assert changed.status_code == 422
    error = changed.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert first.json()["task_id"] in error["message"]


async def test_a_refused_request_leaves_its_key_free_for_the_retry(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url, max_backlog=1, partitions=1)
    async with running_gateway(settings) as client:
        filler = await post(client, "filler", None)  # the backlog is full
        refused = await post(client, "retry me", "order-3")
        assert refused.status_code == 429
    async with running_stack(settings, batcher_settings(redis_url, url, partitions=1)) as stack:
        await stack.results([filler.json()["task_id"]])  # and now it is empty again
        retried = await post(stack.client, "retry me", "order-3", wait=True)
        assert retried.status_code == 200
        assert "Idempotent-Replayed" not in retried.headers
        assert retried.json()["status"] == "SUCCESS"


@pytest.mark.parametrize("key", ["", "x" * 257, "caf\u00e9", "tab\there"])
async def test_a_bad_key_is_a_400(redis_url: str, triton_server: TritonServer, key: str) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        headers = {b"Content-Type": b"text/plain", b"Idempotency-Key": key.encode()}
        answer = await client.post("/v1/inference?model=sim", content=b"x", headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_idempotency_key"


async def test_a_repeat_after_the_result_expired_gets_the_same_task_and_no_inference(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url, result_ttl_s=1),
                             batcher_settings(redis_url, url, result_ttl_s=1)) as stack:
        start = batch_executions(url, "sim")
        first = await post(stack.client, "pay 20", "order-9", wait=True)
        assert first.json()["status"] == "SUCCESS"
        task_id = first.json()["task_id"]
        # Triton counts an execution as it finishes, which can be after its answer reached
        # Ferry (a CI run read its count after the first request's SUCCESS and saw it later):
        # the first request's own execution is counted before the repeat's are.
        assert await wait_until(
            lambda: executions_since(start, batch_executions(url, "sim")) == {1: 1}, 5)
        before = batch_executions(url, "sim")
        assert await wait_until(lambda: not task_keys(redis_client), 5)  # the result expired
        again = await post(stack.client, "pay 20", "order-9", wait=True)
        assert again.status_code == 202 and again.json()["task_id"] == task_id
        assert again.headers["Idempotent-Replayed"] == "true"
        assert (await stack.client.get(f"/v1/result/{task_id}")).status_code == 404
        # Nothing was queued for the repeat (no record, no entry, none read): nothing can run
        # for it, however long one waits.
        assert task_keys(redis_client) == [] and stream_lengths(redis_client) == 0
        assert pending_count(redis_client) == 0
    assert executions_since(before, batch_executions(url, "sim")) == {}
