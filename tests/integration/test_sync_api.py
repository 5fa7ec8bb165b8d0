"""One request per task for synchronous clients: ``Prefer: wait=N`` on ``POST /v1/inference``
(RFC 7240). The answer is 200 with the finished result when it is ready within N seconds, else
the usual 202, which the client follows with ``GET``."""

from __future__ import annotations

import asyncio
import hashlib
import time

import orjson
import pytest
import redis

from ferry.tasks.record import EXPIRED_ERROR
from tests.conftest import TritonServer
from tests.integration.helpers import (
    backlog_counts,
    batcher_settings,
    dead_letters,
    gateway_settings,
    running_gateway,
    running_stack,
    stream_lengths,
    task_keys,
    wait_until,
)

pytestmark = pytest.mark.integration

RAW = {"Content-Type": "application/octet-stream"}


async def test_prefer_wait_answers_with_the_result(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        response = await stack.client.post("/v1/inference?model=sim", content=b"sync",
                                           headers={**RAW, "Prefer": "wait=10"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "SUCCESS"
    assert body["output"] == {"OUTPUT": {"sha256": hashlib.sha256(b"sync").hexdigest(),
                                         "length": 4}}
    assert response.headers["location"] == f"/v1/result/{body['task_id']}"
    assert response.headers["preference-applied"] == "wait=10"


async def test_prefer_wait_that_runs_out_gives_the_usual_202(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        started = time.monotonic()
        response = await stack.client.post("/v1/inference?model=sim_slow", content=b"slow",
                                           headers={**RAW, "Prefer": "respond-async, wait=1"})
        waited = time.monotonic() - started
        assert response.status_code == 202, response.text
        assert 1.0 <= waited < 1.45  # sim_slow takes 1.5 s
        task_id = response.json()["task_id"]
        assert response.headers["location"] == f"/v1/result/{task_id}"
        assert response.headers["preference-applied"] == "wait=1"
        result = await stack.result(task_id)
    assert result["status"] == "SUCCESS"


async def test_a_held_answer_ends_at_the_deadline_and_the_record_says_so(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """No batcher runs: a request held with ``Prefer: wait=10`` and a deadline of 1 s is
    answered EXPIRED at its deadline, not 202 at the wait's end; a GET held past a task's
    deadline, or made after it, answers EXPIRED too. Each record is EXPIRED for good, out of
    its stream and its backlog count."""
    deadline = {"X-Request-Timeout": "1"}
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        started = time.monotonic()
        held = await client.post("/v1/inference?model=sim", content=b"held", headers={
            **RAW, **deadline, "Prefer": "wait=10"})
        assert time.monotonic() - started < 5  # the deadline ended it, not the wait
        assert held.status_code == 200, held.text
        assert held.json()["status"] == "EXPIRED"
        assert held.json()["error"] == EXPIRED_ERROR
        polled = (await client.post("/v1/inference?model=sim", content=b"polled",
                                    headers={**RAW, **deadline})).json()["task_id"]
        started = time.monotonic()
        answer = await client.get(f"/v1/result/{polled}", params={"wait": 10})
        assert time.monotonic() - started < 5 and answer.json()["status"] == "EXPIRED"
        late = (await client.post("/v1/inference?model=sim", content=b"late", headers={
            **RAW, "X-Request-Timeout": "0.2"})).json()["task_id"]
        await asyncio.sleep(0.3)  # past its deadline: time itself must pass
        assert (await client.get(f"/v1/result/{late}")).json()["status"] == "EXPIRED"
    assert [redis_client.hget(key, "status") for key in task_keys(redis_client)] == [
        b"EXPIRED"] * 3
    assert stream_lengths(redis_client) == 0 and backlog_counts(redis_client) == 0


async def test_an_answer_after_the_deadline_is_not_written_as_a_success(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """A batcher that knows nothing yet of sim_slow's 1.5 s sends a task with a 1 s deadline;
    nobody waits for it: the answer comes after the deadline, and the record is EXPIRED."""
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        submitted = await stack.client.post("/v1/inference?model=sim_slow", content=b"slow",
                                            headers={**RAW, "X-Request-Timeout": "1"})
        (key,) = task_keys(redis_client)
        assert await wait_until(lambda: redis_client.hget(key, "status") != b"PENDING", 10)
    record = orjson.loads(redis_client.hget(key, "body") or b"{}")
    assert record["task_id"] == submitted.json()["task_id"]
    assert record["status"] == "EXPIRED" and "output" not in record
    assert record["error"].startswith("deadline passed during inference"), record
    assert record["finished_at"] > record["deadline_at"]


async def test_a_failure_within_the_wait_is_a_final_answer(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        response = await stack.client.post("/v1/inference?model=sim", content=b"poison-sync",
                                           headers={**RAW, "Prefer": "wait=10"})
    assert response.status_code == 200
    assert response.json()["status"] == "FAILED"
    assert "poison input" in response.json()["error"]
    assert len(dead_letters(redis_client)) == 1


@pytest.mark.parametrize("prefer", ["wait=soon", "wait=-3", "wait=nan", "handling=lenient", ""])
async def test_a_preference_that_cannot_be_read_is_ignored(
    redis_url: str, triton_server: TritonServer, prefer: str,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url)) as stack:  # no batcher: no answer
        started = time.monotonic()
        response = await stack.client.post("/v1/inference?model=sim", content=b"x",
                                           headers={**RAW, "Prefer": prefer})
        assert time.monotonic() - started < 0.5
    assert response.status_code == 202
    assert "preference-applied" not in response.headers


async def test_a_longer_wait_than_allowed_is_cut_to_the_limit(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url, max_poll_s=1.0)) as stack:
        started = time.monotonic()
        response = await stack.client.post("/v1/inference?model=sim", content=b"x",
                                           headers={**RAW, "Prefer": "wait=3600"})
        waited = time.monotonic() - started
    assert response.status_code == 202
    assert response.headers["preference-applied"] == "wait=1"
    assert 1.0 <= waited < 2.0


async def test_bad_input_with_prefer_wait_is_refused_at_once(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url)) as stack:
        response = await stack.client.post("/v1/inference?model=nope", content=b"x",
                                           headers={**RAW, "Prefer": "wait=10"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_model"
    assert stream_lengths(redis_client) == 0 and task_keys(redis_client) == []


async def test_hot_routes_refuse_other_methods_and_are_documented(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url)) as stack:
        for method, path, allowed in (("PUT", "/v1/inference", "POST"),
                                      ("POST", f"/v1/result/{'a' * 32}", "GET, DELETE")):
            response = await stack.client.request(method, path)
            assert response.status_code == 405
            assert response.headers["allow"] == allowed
            assert response.json()["error"]["code"] == "method_not_allowed"
        spec = (await stack.client.get("/openapi.json")).json()
    submit = spec["paths"]["/v1/inference"]["post"]
    assert {"200", "202", "400", "404", "413", "415", "422", "429", "503"} <= set(
        submit["responses"])
    assert {"200", "404", "409"} <= set(spec["paths"]["/v1/result/{task_id}"]["delete"][
        "responses"])
    assert any(p["name"] == "Prefer" and p["in"] == "header" for p in submit["parameters"])
    result = spec["paths"]["/v1/result/{task_id}"]["get"]
    assert {"200", "400", "404"} <= set(result["responses"])
    schemas = spec["components"]["schemas"]
    assert {"Accepted", "TaskResult", "ErrorBody", "InferenceRequest"} <= set(schemas)
