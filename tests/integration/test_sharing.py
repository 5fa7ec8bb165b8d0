"""Spend the GPU once per distinct question, against real servers: the result cache answers a
repeat without the queue, and identical requests in flight share one inference."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import redis

from ferry import keys
from ferry.tasks.base import input_digest
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    executions_counted,
    executions_since,
    gateway_settings,
    running_gateway,
    running_stack,
    stream_lengths,
    task_keys,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def inferred(url: str, before: dict[int, int]) -> int:
    """Requests Triton has run for ``sim`` since ``before``."""
    return sum(size * n for size, n in executions_since(before, batch_executions(url,
                                                                               "sim")).items())


async def inferred_once(url: str, before: dict[int, int], rows: int) -> int:
    """``inferred`` once Triton has counted ``rows`` (it counts after its answer went out),
    or 10 s passed; then again after a moment, so that one counted late is not missed."""
    since = await executions_counted(url, "sim", before, rows)
    await asyncio.sleep(0.2)  # a count beyond ``rows`` would show by now
    return max(sum(size * n for size, n in since.items()), inferred(url, before))


async def ask(client: httpx.AsyncClient, text: str, **headers: str) -> httpx.Response:
    return await client.post("/v1/inference?model=sim", content=text.encode(),
                             headers={"Content-Type": "text/plain", "Prefer": "wait=10",
                                      **headers})


async def test_a_repeat_is_answered_from_the_cache_without_the_queue(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        before = batch_executions(url, "sim")
        first = (await ask(stack.client, "same picture")).json()
        assert first["status"] == "SUCCESS" and "cache" not in first
        repeat = await ask(stack.client, "same picture")
        assert repeat.status_code == 200
        hit = repeat.json()
        assert hit["status"] == "SUCCESS" and hit["cache"] == "hit"
        assert hit["output"] == first["output"]
        assert hit["model_version"] == first["model_version"]
        assert hit["task_id"] != first["task_id"]
        assert hit["finished_at"] == hit["created_at"]  # its own times, not the first task's
        pairs = json.loads(repeat.content, object_pairs_hook=lambda p: [k for k, _ in p])
        assert len(pairs) == len(set(pairs))  # no member twice
        assert (await stack.result(hit["task_id"])) == hit
        assert await inferred_once(url, before, 1) == 1  # the repeat cost Triton nothing
        fresh = (await ask(stack.client, "same picture", **{"Cache-Control": "no-cache"})).json()
        assert fresh["status"] == "SUCCESS" and "cache" not in fresh
        assert await inferred_once(url, before, 2) == 2
    assert stream_lengths(redis_client) == 0


async def test_the_cache_can_be_turned_off(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url, cache_ttl_s=0),
                             batcher_settings(redis_url, url, cache_ttl_s=0)) as stack:
        before = batch_executions(url, "sim")
        for _ in range(2):
            assert "cache" not in (await ask(stack.client, "uncached")).json()
        assert await inferred_once(url, before, 2) == 2


async def test_identical_requests_in_flight_share_one_inference(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_gateway(gateway_settings(redis_url, url)) as client:
        answers = await asyncio.gather(*(
            client.post("/v1/inference?model=sim", content=b"popular",
                        headers={"Content-Type": "text/plain"}) for _ in range(10)))
        ids = [a.json()["task_id"] for a in answers]
        assert len(set(ids)) == 10
        assert stream_lengths(redis_client) == 1  # one task queued, nine following it
        partition = keys.partition_of(ids[0], 16)  # identical requests share a partition
        assert {keys.partition_of(t, 16) for t in ids} == {partition}
        leaders: dict[str, bytes | None] = {
            t: redis_client.hget(keys.task_key(t, partition), "leader")  # type: ignore[misc]
            for t in ids}
        follower = next(t for t, held in leaders.items() if held is not None)
        leader = (leaders[follower] or b"").decode()
        assert leaders[leader] is None
        shared = await client.delete(f"/v1/result/{leader}")
        assert shared.status_code == 409
        assert shared.json()["error"]["code"] == "shared_inference"
        dropped = await client.delete(f"/v1/result/{follower}")  # a follower may leave
        assert dropped.status_code == 200 and dropped.json()["status"] == "CANCELLED"
    before = batch_executions(url, "sim")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        results = await stack.results(ids)
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["CANCELLED"] + ["SUCCESS"] * 9
    outputs = {json.dumps(r["output"], sort_keys=True) for r in results if "output" in r}
    assert len(outputs) == 1
    assert sum("collapsed_into" in r for r in results) == 8
    assert inferred(url, before) == 1
    assert len(task_keys(redis_client)) >= 10


async def test_a_repeated_input_run_costs_one_inference_per_distinct_input(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        before = batch_executions(url, "sim")
        texts = [f"image-{i % 20}" for i in range(200)]  # 20 distinct inputs, 10 times each
        answers = []
        for start in range(0, 200, 20):  # in waves of 20 concurrent requests
            answers += await asyncio.gather(*(ask(stack.client, t)
                                              for t in texts[start:start + 20]))
        records = [a.json() for a in answers]
        metrics = (await stack.client.get("/metrics")).text
    assert {r["status"] for r in records} == {"SUCCESS"}
    hits = sum(r.get("cache") == "hit" for r in records)
    collapsed = sum("collapsed_into" in r for r in records)
    calls = inferred(url, before)
    print(f"repeated-input run: 200 requests over 20 inputs: {hits} cache hits "
          f"({hits / 200:.0%}), {collapsed} collapsed, Triton inferred {calls}")
    assert calls == 20
    assert hits + collapsed == 180
    assert 'ferry_tasks_shared_total{how="hit",model="sim",version=""}' in metrics


async def test_an_unreadable_cache_entry_is_a_miss_not_a_failure(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        first = (await ask(stack.client, "warm")).json()
        digest = input_digest("sim", first["model_version"], b"broken entry")
        key = keys.cache_key(keys.partition_of_digest(digest, 16), digest)
        redis_client.rpush(key, "not a cached answer")  # the wrong type: GET fails on it
        answer = await ask(stack.client, "broken entry")
        assert answer.status_code == 200
        assert answer.json()["status"] == "SUCCESS" and "cache" not in answer.json()
        again = (await ask(stack.client, "broken entry")).json()  # the answer replaced it
        assert again["cache"] == "hit"


async def test_a_task_with_a_deadline_or_being_cancelled_is_never_followed(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_gateway(gateway_settings(redis_url, url)) as client:  # all stay queued
        timed = await client.post("/v1/inference?model=sim", content=b"deadline input",
                                  headers={"Content-Type": "text/plain",
                                           "X-Request-Timeout": "60"})
        after_timed = (await ask_later(client, "deadline input")).json()
        leader = (await ask_later(client, "flagged input")).json()["task_id"]
        redis_client.hset(keys.task_key(leader, keys.partition_of(leader, 16)), "cancel", "1")
        after_flagged = (await ask_later(client, "flagged input")).json()
    for task_id in (after_timed["task_id"], after_flagged["task_id"]):
        record = redis_client.hgetall(keys.task_key(task_id, keys.partition_of(task_id, 16)))
        assert b"leader" not in record and b"entry" in record  # queued on its own
    assert timed.status_code == 202


async def ask_later(client: httpx.AsyncClient, text: str) -> httpx.Response:
    """Submit without waiting for the answer (no batcher runs)."""
    response = await client.post("/v1/inference?model=sim", content=text.encode(),
                                 headers={"Content-Type": "text/plain"})
    assert response.status_code == 202, response.text
    return response
