"""Model versions through the whole stack on a real Triton: pinning through ``/v1`` and the
Open Inference Protocol, the version in every record and metric, and cache isolation between
versions. (Rollouts, shadows and the cascade: ``test_rollouts.py``.)"""

from __future__ import annotations

import hashlib

import httpx
import orjson
import pytest

from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, gateway_settings, running_stack

pytestmark = pytest.mark.integration  # a few are also run on a Redis Cluster: marked
MODEL = "sim_versions"


def variant(payload: bytes) -> bool:
    """Whether version 2 of ``sim_versions`` marks this input (its answer differs from 1's)."""
    return int(hashlib.sha256(payload).hexdigest()[:2], 16) % 4 == 0


def payloads(count: int, *, variants: bool) -> list[bytes]:
    """Inputs version 2 answers differently (``variants``) or alike."""
    found = []
    for i in range(10 * count):
        payload = f"item-{i}".encode()
        if variant(payload) == variants:
            found.append(payload)
        if len(found) == count:
            return found
    raise AssertionError("not enough inputs")


async def submit(client: httpx.AsyncClient, payload: bytes, version: str = "",
                 **fields: str) -> httpx.Response:
    body = {"model": MODEL, "input": payload.decode(), **fields}
    if version:
        body["model_version"] = version
    return await client.post("/v1/inference", content=orjson.dumps(body),
                             headers={"Content-Type": "application/json", "Prefer": "wait=20"})


@pytest.mark.cluster
async def test_a_request_pins_its_version_through_v1_and_the_protocol(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    odd = payloads(1, variants=True)[0]
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=5)) as stack:
        one, two = [await submit(stack.client, odd, v) for v in ("1", "2")]
        newest = await submit(stack.client, odd)
        query = await stack.client.post(f"/v1/inference?model={MODEL}&version=2", content=odd,
                                        headers={"Content-Type": "text/plain",
                                                 "Prefer": "wait=20"})
        oip = await stack.client.post(f"/v2/models/{MODEL}/versions/2/infer", json={
            "inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1],
                        "data": [odd.decode()]}]})
        unknown = await submit(stack.client, odd, "9")
        metrics = stack.batchers[0].metrics.registry
        finished = {v: metrics.get_sample_value("ferry_tasks_finished_total", {
            "model": MODEL, "status": "SUCCESS", "version": v}) for v in ("1", "2", "5")}
    assert [r.status_code for r in (one, two, newest, query, oip)] == [200] * 5
    assert one.json()["model_version"] == "1" and "variant" not in one.json()["output"]["OUTPUT"]
    assert two.json()["model_version"] == "2" and two.json()["output"]["OUTPUT"]["variant"]
    assert newest.json()["model_version"] == "5"  # Triton's policy: the newest
    assert query.json()["model_version"] == "2"
    assert oip.json()["model_version"] == "2"
    assert orjson.loads(oip.json()["outputs"][0]["data"][0])["variant"] is True
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == \
        "unknown_model_version"
    assert finished == {"1": 1, "2": 2, "5": 1}  # the query form was a cache hit


async def test_the_cache_and_idempotency_keys_keep_versions_apart(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    odd = payloads(1, variants=True)[0]
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=5)) as stack:
        first = (await submit(stack.client, odd, "1")).json()
        other = (await submit(stack.client, odd, "2")).json()
        again = (await submit(stack.client, odd, "2")).json()
        keyed = await stack.client.post("/v1/inference", content=orjson.dumps(
            {"model": MODEL, "input": "k", "model_version": "1"}), headers={
            "Content-Type": "application/json", "Idempotency-Key": "key-1"})
        reused = await stack.client.post("/v1/inference", content=orjson.dumps(
            {"model": MODEL, "input": "k", "model_version": "2"}), headers={
            "Content-Type": "application/json", "Idempotency-Key": "key-1"})
    assert "cache" not in other and other["model_version"] == "2"  # not version 1's answer
    assert other["output"] != first["output"]
    assert again["cache"] == "hit" and again["model_version"] == "2"
    assert again["output"] == other["output"]
    assert keyed.status_code == 202
    assert reused.status_code == 422 and reused.json()["error"]["code"] == \
        "idempotency_key_reused"
