"""Cancellation against real servers: a task that has not reached Triton ends CANCELLED and never
reaches it; one that has finished (or is being inferred) answers 409."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis

from ferry import keys
from ferry.priority import Priority
from tests.conftest import TritonServer
from tests.integration.helpers import (
    backlog_counts,
    batch_executions,
    batcher_settings,
    gateway_settings,
    known_model,
    running_gateway,
    running_stack,
    stream_lengths,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


async def cancel(client: httpx.AsyncClient, task_id: str) -> httpx.Response:
    return await client.delete(f"/v1/result/{task_id}")


async def test_a_queued_task_is_cancelled_at_once_and_never_reaches_triton(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_gateway(gateway_settings(redis_url, url)) as client:
        task_id = (await client.post("/v1/inference?model=sim", content=b"never",
                                     headers={"Content-Type": "text/plain"})).json()["task_id"]
        answer = await cancel(client, task_id)
        assert answer.status_code == 200
        record = answer.json()
        assert record["status"] == "CANCELLED" and record["task_id"] == task_id
        assert record["error"] == "cancelled by the client before inference"
        assert record["finished_at"] >= record["created_at"]
        assert stream_lengths(redis_client) == 0 and backlog_counts(redis_client) == 0
        assert (await client.get(f"/v1/result/{task_id}")).json() == record
        again = await cancel(client, task_id)  # DELETE is idempotent: the same answer again
        assert again.status_code == 200 and again.json() == record
    before = batch_executions(url, "sim")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        done = await stack.results([await stack.submit("after")])
        assert done[0]["status"] == "SUCCESS"
    executed = {size: n - before.get(size, 0) for size, n in batch_executions(url, "sim").items()}
    assert sum(size * n for size, n in executed.items()) == 1  # only the later task


async def test_a_boarded_task_is_cancelled_by_the_batcher_that_holds_it(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    held = batcher_settings(redis_url, url, max_wait_ms=60_000, adaptive_flush=False)
    async with running_stack(gateway_settings(redis_url, url), held) as stack:
        before = batch_executions(url, "sim")
        batcher = stack.batchers[0]
        task_id = await stack.submit("boarded")
        assert await wait_until(lambda: batcher.buffered == 1, 5)  # read: in its PEL now
        answer = await cancel(stack.client, task_id)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "CANCELLED"
        assert batcher.buffered == 0
        assert (await stack.result(task_id))["status"] == "CANCELLED"
        assert batch_executions(url, "sim") == before


async def test_a_task_being_inferred_cannot_be_cancelled(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        batcher = stack.batchers[0]
        task_id = await stack.submit("busy", model="sim_slow")  # 1.5 s at Triton
        assert await wait_until(lambda: batcher.model_state("sim_slow") is not None and
                                known_model(batcher, "sim_slow").inflight == 1, 10)
        answer = await cancel(stack.client, task_id)
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] in ("already_running", "already_finished")
        assert (await stack.result(task_id))["status"] == "SUCCESS"


async def test_cancel_of_an_unknown_task_is_404_and_other_methods_405(
    redis_url: str, triton_server: TritonServer,
) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        missing = await cancel(client, "0" * 32)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "unknown_task"
        assert (await cancel(client, "not-a-task")).status_code == 404
        put = await client.put("/v1/result/" + "0" * 32)
        assert put.status_code == 405 and put.headers["Allow"] == "GET, DELETE"


async def test_many_concurrent_cancels_of_queued_tasks_leave_no_backlog(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        answers = await asyncio.gather(*(
            client.post("/v1/inference?model=sim&priority=low", content=b"x%d" % i,
                        headers={"Content-Type": "text/plain"}) for i in range(40)))
        ids = [a.json()["task_id"] for a in answers]
        cancels = await asyncio.gather(*(cancel(client, t) for t in ids + ids[:10]))
    assert {c.status_code for c in cancels} == {200}
    assert {c.json()["status"] for c in cancels} == {"CANCELLED"}
    assert len({c.json()["finished_at"] for c in cancels}) <= 40  # each cancelled once
    assert backlog_counts(redis_client) == 0
    assert sum(int(redis_client.xlen(keys.partition_stream(p, Priority.LOW)))
               for p in range(16)) == 0
