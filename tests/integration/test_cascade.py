"""The two-tier cascade on a real Triton: the first answer at once, a review at batch priority
written into its record (and its webhook sent again), only where the condition holds, and every
answer reviewed under load."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import pytest

from ferry.stack.up import sample_image
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, gateway_settings, running_stack
from tests.integration.test_webhooks import SECRET, Receiver, receiver  # noqa: F401 - fixture

pytestmark = pytest.mark.integration  # a few are also run on a Redis Cluster: marked


async def reviewed(client: httpx.AsyncClient, task_id: str, timeout_s: float = 20
                   ) -> dict[str, Any]:
    """The task's record once its review has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        record: dict[str, Any] = (await client.get(f"/v1/result/{task_id}")).json()
        if record.get("review", {}).get("status") not in (None, "PENDING") or \
                time.monotonic() > deadline:
            return record
        await asyncio.sleep(0.1)


@pytest.mark.cluster
async def test_a_review_lands_in_the_first_answers_record_with_a_webhook(
    redis_url: str, triton_server: TritonServer, receiver: Receiver,  # noqa: F811
) -> None:
    url = triton_server.grpc_url
    cascades = orjson.dumps({"sim": {"review_model": "sim_versions", "review_version": "2",
                                     "when": "always"}}).decode()
    hooks = {"webhook_allowed_hosts": "127.0.0.1", "webhook_secret": SECRET}
    async with running_stack(gateway_settings(redis_url, url, **hooks),
                             batcher_settings(redis_url, url, cascades=cascades, max_wait_ms=5,
                                              **hooks)) as stack:
        first = await stack.client.post("/v1/inference", content=orjson.dumps(
            {"model": "sim", "input": "to review", "callback_url": receiver.url()}), headers={
            "Content-Type": "application/json", "Prefer": "wait=20"})
        record = await reviewed(stack.client, first.json()["task_id"])
        review = record["review"]
        own = (await stack.client.get(f"/v1/result/{review['task_id']}")).json()
        queued = await stack.client.post("/v2/models/sim/infer", headers={
            "Prefer": "respond-async"}, json={"inputs": [
                {"name": "INPUT", "datatype": "BYTES", "shape": [1, 1], "data": ["oip"]}]})
        tensors = await reviewed(stack.client, queued.json()["task_id"])
        for _ in range(100):
            if len(receiver.calls) >= 2:
                break
            await asyncio.sleep(0.1)
    answer = first.json()
    assert answer["status"] == "SUCCESS" and answer["review"]["status"] == "PENDING"
    assert answer["review"]["model"] == "sim_versions"
    assert review["status"] == "SUCCESS" and review["model_version"] == "2"
    assert review["output"] == own["output"] and own["priority"] == "batch"
    assert record["output"] == answer["output"]  # the first answer stands
    assert tensors["review"]["status"] == "SUCCESS"  # a protocol request's, as tensors
    assert tensors["review"]["output"]["outputs"][0]["name"] == "OUTPUT"
    # Two deliveries, one when the answer ends and one when its review does, each the record as
    # it is when sent: the first may already hold the review (on a Redis Cluster its delivery
    # often left after the review had ended), and they may arrive in either order.
    bodies = [orjson.loads(body) for _, _, body in receiver.calls]
    assert len(bodies) == 2 and "SUCCESS" in [b["review"]["status"] for b in bodies]
    assert {b["review"]["status"] for b in bodies} <= {"PENDING", "SUCCESS"}
    assert all(b["task_id"] == answer["task_id"] and b["output"] == answer["output"]
               for b in bodies)


async def test_only_answers_that_meet_the_condition_are_reviewed(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    cascades = orjson.dumps({"moderation": {"review_model": "moderation",
                                            "review_version": "2",
                                            "when": "labels:FACE_FEMALE"}}).decode()
    photo = sample_image().read_bytes()
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, cascades=cascades,
                                              max_wait_ms=5)) as stack:
        answers = []
        for image, kind in ((photo, "image/jpeg"), (_blank(), "image/png")):
            response = await stack.client.post("/v1/inference?model=moderation", content=image,
                                               headers={"Content-Type": kind,
                                                        "Prefer": "wait=30"})
            answers.append(response.json())
        face = await reviewed(stack.client, answers[0]["task_id"], 40)
    assert "review" in answers[0] and "review" not in answers[1]
    assert face["review"]["status"] == "SUCCESS"
    labels = [d["label"] for d in face["review"]["output"]["DETECTIONS"]["detections"]]
    assert labels == ["FACE_FEMALE"]


async def test_under_load_every_answer_is_reviewed_behind_interactive_work(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """``sim_overload`` (t(B) = 50 + 2B ms, batches of 8) reviews its own answers under an
    open-loop load: every answer is answered at once and reviewed later, at batch priority.
    (What the reviews cost interactive latency is measured, not asserted: ``make bench``'s
    cascade part, in BENCHMARKS.md.)"""
    url = triton_server.grpc_url
    cascades = orjson.dumps({"sim_overload": {"review_model": "sim_overload",
                                              "review_version": "1",
                                              "when": "always"}}).decode()
    async with running_stack(gateway_settings(redis_url, url, cache_ttl_s=0),
                             batcher_settings(redis_url, url, max_wait_ms=5,
                                              cascades=cascades)) as stack:
        answers = await _open_loop(stack.client, rate=10, seconds=5)
        ended = [await reviewed(stack.client, a["task_id"]) for a in answers]
        reviews = [(await stack.client.get(f"/v1/result/{r['review']['task_id']}")).json()
                   for r in ended[:5]]
    assert all(a["status"] == "SUCCESS" and a["review"]["status"] == "PENDING"
               for a in answers)  # answered before the review ran
    assert [r["review"]["status"] for r in ended] == ["SUCCESS"] * len(answers)
    assert all(r["priority"] == "batch" and r["model_version"] == "1" for r in reviews)


async def _open_loop(client: httpx.AsyncClient, rate: float, seconds: float
                     ) -> list[dict[str, Any]]:
    """Requests at ``rate`` a second for ``seconds`` (``Prefer: wait``): their answers."""
    async def one(i: int) -> dict[str, Any]:
        response = await client.post("/v1/inference?model=sim_overload",
                                     content=f"load-{i}".encode(),
                                     headers={"Content-Type": "text/plain",
                                              "Prefer": "wait=20"})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    tasks, start = [], time.monotonic()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))  # pacing: arrivals
        tasks.append(asyncio.create_task(one(i)))
    return list(await asyncio.gather(*tasks))


def _blank() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 64), "white").save(out, format="PNG")
    return out.getvalue()
