"""Every API path, and every kind of bad input: a 4xx that names the problem, nothing enqueued."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import redis
from PIL import Image

from ferry.stack.up import sample_image
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    gateway_settings,
    running_gateway,
    running_stack,
    stream_lengths,
    task_keys,
)

pytestmark = [pytest.mark.integration]  # the cluster run repeats only the enqueueing tests


@pytest.fixture
async def gateway(redis_url: str, triton_server: TritonServer) -> AsyncIterator[httpx.AsyncClient]:
    settings = gateway_settings(redis_url, triton_server.grpc_url, max_body_bytes=64 * 1024)
    async with running_gateway(settings) as client:
        yield client


def gif_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format="GIF")
    return buffer.getvalue()


BAD_REQUESTS: list[tuple[str, dict[str, str], bytes, int, str]] = [
    # (query, headers, body, status, error code)
    ("", {"Content-Type": "application/json"}, b'{"input": "x"', 400, "malformed_json"),
    ("", {"Content-Type": "application/json"}, b'["input"]', 400, "malformed_json"),
    ("", {"Content-Type": "application/json"}, b"{}", 400, "missing_input"),
    ("", {"Content-Type": "application/json"}, b'{"input": ""}', 400, "empty_input"),
    ("", {"Content-Type": "application/json"}, b'{"input_base64": "***"}', 400, "invalid_base64"),
    ("", {"Content-Type": "application/json"}, b'{"input": "a", "input_base64": "YQ=="}', 400,
     "ambiguous_input"),
    ("", {"Content-Type": "application/json"}, b'{"input": "a", "extra": 1}', 400,
     "unknown_field"),
    ("", {"Content-Type": "application/json"}, b'{"input": 5}', 400, "invalid_field"),
    ("", {"Content-Type": "application/json"}, b'{"model": "nope", "input": "a"}', 404,
     "unknown_model"),
    ("?model=nope", {"Content-Type": "application/octet-stream"}, b"abc", 404, "unknown_model"),
    ("?model=sim", {"Content-Type": "application/octet-stream"}, b"", 400, "empty_input"),
    ("?model=sim", {"Content-Type": "application/xml"}, b"<a/>", 415, "unsupported_media_type"),
    ("?model=sim", {}, b"abc", 415, "unsupported_media_type"),
    ("?model=sim&bogus=1", {"Content-Type": "application/octet-stream"}, b"abc", 400,
     "unknown_parameter"),
    ("?model=sim&model=sim", {"Content-Type": "application/octet-stream"}, b"abc", 400,
     "invalid_parameter"),
    ("?model=sim&client_id=", {"Content-Type": "application/octet-stream"}, b"abc", 400,
     "invalid_parameter"),
    ("?model=sim", {"Content-Type": "application/octet-stream"}, b"x" * (64 * 1024 + 1), 413,
     "body_too_large"),
    ("?model=moderation", {"Content-Type": "image/jpeg"}, b"\xff\xd8 not really a jpeg", 400,
     "undecodable_image"),
    ("?model=moderation", {"Content-Type": "image/gif"}, gif_bytes(), 415,
     "unsupported_media_type"),
    ("", {"Content-Type": "application/json"},
     json.dumps({"model": "moderation", "input_base64": base64.b64encode(gif_bytes()).decode()}
                ).encode(), 400, "undecodable_image"),
    ("", {"Content-Type": "application/json"}, b'{"model": "moderation", "input": "hello"}', 400,
     "undecodable_image"),
]


@pytest.mark.cluster
@pytest.mark.parametrize(("query", "headers", "body", "status", "code"), BAD_REQUESTS)
async def test_bad_input_is_refused_and_nothing_is_enqueued(
    gateway: httpx.AsyncClient, redis_client: redis.Redis, query: str, headers: dict[str, str],
    body: bytes, status: int, code: str,
) -> None:
    response = await gateway.post(f"/v1/inference{query}", content=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert len(error["message"]) > 10
    assert stream_lengths(redis_client) == 0
    assert task_keys(redis_client) == []


@pytest.mark.cluster
async def test_accepted_request_is_enqueued_once_and_pending(
    gateway: httpx.AsyncClient, redis_client: redis.Redis,
) -> None:
    response = await gateway.post("/v1/inference", json={"input": "hello", "client_id": "c1"})
    assert response.status_code == 202
    body = response.json()
    task_id = body["task_id"]
    assert len(task_id) == 32 and int(task_id, 16) >= 0
    assert body["status_url"] == f"/v1/result/{task_id}"
    assert response.headers["location"] == body["status_url"]
    assert stream_lengths(redis_client) == 1
    result = (await gateway.get(body["status_url"])).json()
    assert result["status"] == "PENDING"
    assert result["model"] == "sim"  # the gateway's default in these tests
    assert "output" not in result and "finished_at" not in result


async def test_task_ids_are_unique(gateway: httpx.AsyncClient) -> None:
    ids = set()
    for _ in range(20):
        response = await gateway.post("/v1/inference", json={"input": "same"})
        ids.add(response.json()["task_id"])
    assert len(ids) == 20


@pytest.mark.parametrize(("query", "code"), [
    ("?wait=31", "invalid_wait"), ("?wait=-1", "invalid_wait"), ("?wait=soon", "invalid_parameter"),
])
async def test_wait_out_of_range_is_a_400(gateway: httpx.AsyncClient, query: str,
                                          code: str) -> None:
    task_id = (await gateway.post("/v1/inference", json={"input": "x"})).json()["task_id"]
    response = await gateway.get(f"/v1/result/{task_id}{query}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert "wait" in response.json()["error"]["message"]


@pytest.mark.parametrize("task_id", ["0" * 32, "not-a-task-id", "A" * 32])
async def test_unknown_task_is_a_404_that_says_so(gateway: httpx.AsyncClient,
                                                   task_id: str) -> None:
    response = await gateway.get(f"/v1/result/{task_id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_task"
    assert "expired" in response.json()["error"]["message"]


async def test_health_readiness_metrics_and_docs(gateway: httpx.AsyncClient) -> None:
    assert (await gateway.get("/healthz")).json() == {"status": "ok"}
    ready = await gateway.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True,
                            "checks": {"redis": "ok", "triton": "ok", "default_model": "ok"},
                            "circuits": {}}
    await gateway.post("/v1/inference", json={"input": "x"})
    metrics = (await gateway.get("/metrics")).text
    assert 'ferry_tasks_accepted_total{model="sim",version=""} 1.0' in metrics
    assert 'route="/v1/inference"' in metrics
    spec = (await gateway.get("/openapi.json")).json()
    assert {"/v1/inference", "/v1/result/{task_id}", "/healthz", "/readyz"} <= set(spec["paths"])
    assert "image/jpeg" in spec["paths"]["/v1/inference"]["post"]["requestBody"]["content"]
    assert (await gateway.get("/docs")).status_code == 200


def sample(metrics: str, name: str) -> float:
    """One unlabelled series' value from a /metrics page."""
    return next(float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith(name + " "))


async def test_admissions_sent_together_share_redis_calls(gateway: httpx.AsyncClient) -> None:
    """Thirty requests at once: each admitted on its own (202, its own task), in fewer Redis
    calls than requests, as ferry_admissions_per_call counts them."""
    page = (await gateway.get("/metrics")).text
    calls, carried = (sample(page, "ferry_admissions_per_call_count"),
                      sample(page, "ferry_admissions_per_call_sum"))
    answers = await asyncio.gather(*(gateway.post("/v1/inference", json={"input": f"c{i}"})
                                     for i in range(30)))
    assert [a.status_code for a in answers] == [202] * 30
    assert len({a.json()["task_id"] for a in answers}) == 30
    page = (await gateway.get("/metrics")).text
    assert sample(page, "ferry_admissions_per_call_sum") - carried == 30
    assert sample(page, "ferry_admissions_per_call_count") - calls < 30


async def test_unknown_route_and_method_get_json_errors(gateway: httpx.AsyncClient) -> None:
    missing = await gateway.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = await gateway.get("/v1/inference")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


async def test_readiness_fails_when_triton_is_unreachable(redis_url: str) -> None:
    settings = gateway_settings(redis_url, "127.0.0.1:9")
    async with running_gateway(settings) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["triton"] == "not ready"
        refused = await client.post("/v1/inference", json={"input": "x"})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "unavailable"


async def test_every_input_form_reaches_the_model(redis_url: str,
                                                  triton_server: TritonServer) -> None:
    """JSON text, JSON base64 and a raw body each arrive at the model as the same bytes."""
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=5)) as stack:
        payload = "zürich ☃".encode()
        forms = [
            {"json": {"model": "sim", "input": payload.decode()}},
            {"json": {"model": "sim", "input_base64": base64.b64encode(payload).decode()}},
            {"content": payload, "headers": {"Content-Type": "application/octet-stream"},
             "params": {"model": "sim"}},
            {"content": payload, "headers": {"Content-Type": "text/plain; charset=utf-8"},
             "params": {"model": "sim"}},
        ]
        expected = {"sha256": hashlib.sha256(payload).hexdigest(), "length": len(payload)}
        for form in forms:
            response = await stack.client.post("/v1/inference", **form)  # type: ignore[arg-type]
            assert response.status_code == 202, response.text
            result = await stack.result(response.json()["task_id"])
            assert result["status"] == "SUCCESS"
            assert result["output"] == {"OUTPUT": expected}
            assert result["model"] == "sim" and result["model_version"] == "1"
            assert result["finished_at"] >= result["created_at"]


async def test_sample_image_is_accepted_as_raw_body(gateway: httpx.AsyncClient) -> None:
    response = await gateway.post("/v1/inference?model=moderation",
                                  content=sample_image().read_bytes(),
                                  headers={"Content-Type": "image/jpeg"})
    assert response.status_code == 202, response.text


@pytest.mark.single_redis  # a Redis of its own, or counts one server's commands
async def test_redis_down_is_a_503_not_a_crash(triton_server: TritonServer) -> None:
    settings = gateway_settings("redis://127.0.0.1:9/0", triton_server.grpc_url)
    async with running_gateway(settings) as client:
        refused = await client.post("/v1/inference", json={"input": "x"})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "unavailable"
        assert refused.headers["retry-after"] == "1"
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["redis"].startswith("unreachable")
        polled = await client.get(f"/v1/result/{'a' * 32}")
        assert polled.status_code == 503


@pytest.mark.single_redis  # a Redis of its own, or counts one server's commands
async def test_a_redis_that_cannot_write_is_a_503_not_a_500(
    gateway: httpx.AsyncClient, redis_client: redis.Redis,
) -> None:
    """Out of memory (also LOADING, READONLY, BUSY): Redis answers "not now", and so does Ferry."""
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", "1")
    try:
        refused = await gateway.post("/v1/inference", json={"input": "x"})
        waited = await gateway.post("/v1/inference", json={"input": "x"},
                                    headers={"Prefer": "wait=5"})
    finally:
        redis_client.config_set("maxmemory", "0")
    for response in (refused, waited):
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "redis_out_of_memory"
        assert "out of memory" in response.json()["error"]["message"]
        assert response.headers["retry-after"] == "1"
    assert stream_lengths(redis_client) == 0
