"""One request per task for synchronous clients: ``Prefer: wait=N`` on ``POST /v1/inference``
(RFC 7240). The answer is 200 with the finished result when it is ready within N seconds, else
the usual 202, which the client follows with ``GET``."""

from __future__ import annotations

import hashlib
import time

import pytest
import redis

from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    dead_letters,
    gateway_settings,
    running_stack,
    stream_lengths,
    task_keys,
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
