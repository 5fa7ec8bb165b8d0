"""``/v1/inference``'s tensor form against real servers: an infer request of the Open Inference
Protocol in JSON (told apart by ``inputs``) is checked against the model as ``/v2``'s infer
checks it, admitted as a task, and its record's output is the protocol's answer; a JSON payload
(``input``) is what it always was, for ``sim`` too."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis
import tritonclient.http as triton_http
from aiohttp import web

from ferry.stack.ports import free_port
from ferry.webhooks import verify
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Stack,
    backlog_counts,
    batcher_settings,
    gateway_settings,
    running_gateway,
    running_stack,
    stream_lengths,
    task_keys,
)
from tests.integration.test_security import ALICE, BOB, keyed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
SECRET = "tensor-hooks"

LEFT = np.arange(32, dtype=np.float32).reshape(2, 16) - 7.5
RIGHT = np.full((2, 16), 2.25, dtype=np.float32)


def fp32(name: str, values: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": list(values.shape),
            "data": values.flatten().tolist()}


def simple(left: np.ndarray[Any, Any] = LEFT, right: np.ndarray[Any, Any] = RIGHT,
           **more: Any) -> dict[str, Any]:
    """A tensor form for ``simple``: INPUT0 and INPUT1, FP32 [rows, 16]."""
    return {"inputs": [fp32("INPUT0", left), fp32("INPUT1", right)], **more}


async def submit(client: httpx.AsyncClient, body: dict[str, Any], query: str = "?model=simple",
                 headers: dict[str, str] | None = None) -> httpx.Response:
    return await client.post(f"/v1/inference{query}", content=orjson.dumps(body),
                             headers={"Content-Type": "application/json", **(headers or {})})


async def accepted(client: httpx.AsyncClient, body: dict[str, Any],
                   query: str = "?model=simple", headers: dict[str, str] | None = None) -> str:
    answer = await submit(client, body, query, headers)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["task_id"])


def outputs(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert record["status"] == "SUCCESS", record
    return {o["name"]: o for o in record["output"]["outputs"]}


@pytest.fixture
async def stack(redis_url: str, triton_server: TritonServer) -> AsyncIterator[Stack]:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as running:
        yield running


async def test_a_tensor_request_round_trips_with_exact_numbers(stack: Stack) -> None:
    task_id = await accepted(stack.client, simple(id="sums"))
    record = await stack.result(task_id)
    assert record["model"] == "simple" and record["model_version"] == "1"
    assert record["output"]["id"] == "sums"
    found = outputs(record)
    assert found["OUTPUT0"] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 16],
                                "data": (LEFT + RIGHT).flatten().tolist()}
    assert found["OUTPUT1"]["data"] == (LEFT - RIGHT).flatten().tolist()
    assert found["OUTPUT1"]["shape"] == [2, 16]


async def test_requested_outputs_are_the_only_ones_answered(stack: Stack) -> None:
    task_id = await accepted(stack.client, simple(outputs=[{"name": "OUTPUT1"}]))
    found = outputs(await stack.result(task_id))
    assert list(found) == ["OUTPUT1"]
    assert found["OUTPUT1"]["data"] == (LEFT - RIGHT).flatten().tolist()


async def test_the_answer_is_v2s_and_tritons_for_the_same_inputs(
        stack: Stack, triton: triton_http.InferenceServerClient) -> None:
    body = simple(id="same", outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT1"}])
    record = await stack.result(await accepted(stack.client, body))
    v2 = await stack.client.post("/v2/models/simple/infer", content=orjson.dumps(body))
    assert v2.status_code == 200, v2.text
    assert record["output"] == {key: v2.json()[key] for key in ("id", "outputs")}
    inputs = []
    for name, values in (("INPUT0", LEFT), ("INPUT1", RIGHT)):
        tensor = triton_http.InferInput(name, list(values.shape), "FP32")
        tensor.set_data_from_numpy(values, binary_data=False)
        inputs.append(tensor)
    wanted = [triton_http.InferRequestedOutput(n, binary_data=False)
              for n in ("OUTPUT0", "OUTPUT1")]
    theirs = triton.infer("simple", inputs, outputs=wanted, request_id="same").get_response()
    assert record["output"]["outputs"] == theirs["outputs"]


async def test_sim_takes_json_payloads_as_before_and_tensors_too(stack: Stack) -> None:
    payload = await accepted(stack.client, {"model": "sim", "input": "hello"}, query="")
    record = await stack.result(payload)
    assert record["output"] == {"OUTPUT": {"length": 5, "sha256": hashlib.sha256(
        b"hello").hexdigest()}}
    tensors = await accepted(stack.client, {"inputs": [
        {"name": "INPUT", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}]},
        query="?model=sim")
    found = outputs(await stack.result(tensors))
    assert found["OUTPUT"]["datatype"] == "BYTES" and found["OUTPUT"]["shape"] == [1, 1]
    assert orjson.loads(found["OUTPUT"]["data"][0]) == record["output"]["OUTPUT"]
    for body, query, code in (({"input": "x", "inputz": []}, "", "unknown_field"),
                              ({"input": "x"}, "?version=v1", "invalid_parameter")):
        refused = await submit(stack.client, body, query)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == code


def _bad(**changes: Any) -> dict[str, Any]:
    return {**simple(), **changes}


GOOD = simple()["inputs"]
BAD: dict[str, tuple[dict[str, Any], str, str, str]] = {  # body, query, code, reason
    "wrong datatype": (_bad(inputs=[{**GOOD[0], "datatype": "INT32", "data": [1] * 32},
                                    GOOD[1]]), "", "invalid_tensors", "datatype INT32"),
    "wrong shape": (_bad(inputs=[{**GOOD[0], "shape": [4, 8]}, GOOD[1]]), "",
                    "invalid_tensors", "shape [4, 8]"),
    "byte count": (_bad(inputs=[{**GOOD[0], "data": [1.0] * 31}, GOOD[1]]), "",
                   "invalid_tensors", "INPUT0"),
    "rows disagree": (_bad(inputs=[GOOD[0], fp32("INPUT1", RIGHT[:1])]), "",
                      "invalid_tensors", "disagree"),
    "rows over max_batch_size": (simple(np.zeros((9, 16), np.float32),
                                        np.zeros((9, 16), np.float32)), "",
                                 "invalid_tensors", "max_batch_size"),
    "unknown input": (_bad(inputs=[*GOOD, fp32("INPUT7", RIGHT)]), "", "invalid_tensors",
                      "no input 'INPUT7'"),
    "missing input": (_bad(inputs=GOOD[:1]), "", "invalid_tensors", "'INPUT1' is missing"),
    "unknown output": (_bad(outputs=[{"name": "OUTPUT9"}]), "", "invalid_tensors",
                       "no output 'OUTPUT9'"),
    "no inputs": (_bad(inputs=[]), "", "invalid_tensors", "inputs"),
    "binary data": (_bad(inputs=[{**GOOD[0], "data": None,
                                  "parameters": {"binary_data_size": 128}}, GOOD[1]]), "",
                    "invalid_tensors", "binary_data_size"),
    "sequence": (_bad(parameters={"sequence_id": 7}), "", "invalid_tensors", "sequences"),
    "custom parameter": (_bad(parameters={"temperature": 1}), "", "invalid_tensors",
                         "'temperature'"),
    "payload too": (_bad(input="hello"), "", "ambiguous_input", "'input'"),
    "unknown field": (_bad(extra=1), "", "unknown_field", "['extra']"),
    "version not a number": (simple(), "&version=latest", "invalid_parameter",
                             "query.version"),
    "priorities disagree": (_bad(parameters={"priority": 1}), "&priority=low",
                            "invalid_priority", "high"),
    "deadlines disagree": (_bad(parameters={"timeout": 2_000_000}, timeout_s=3), "",
                           "invalid_timeout", "2 s"),
}


@pytest.mark.parametrize("case", sorted(BAD))
async def test_a_bad_tensor_request_is_refused_and_nothing_is_enqueued(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
        case: str) -> None:
    body, query, code, reason = BAD[case]
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        answer = await submit(client, body, f"?model=simple{query}")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == code
    assert reason in answer.json()["error"]["message"]
    assert (task_keys(redis_client), stream_lengths(redis_client),
            backlog_counts(redis_client)) == ([], 0, 0)


async def test_an_unknown_model_or_version_is_a_404(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        for query in ("?model=no_such_model", "?model=simple&version=7", "?model=simple&version=0",
                      f"?model=simple&version={'9' * 18}"):
            answer = await submit(client, simple(), query)
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["code"] == "unknown_model"
        pinned = await accepted(client, simple(), "?model=simple&version=1")
        assert (await client.get(f"/v1/result/{pinned}")).json()["status"] == "PENDING"
    assert len(task_keys(redis_client)) == 1


async def test_priority_and_deadline_come_from_v1_or_the_request_and_may_agree(
        redis_url: str, triton_server: TritonServer) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        cases = [(simple(parameters={"priority": 1}), {}, "high", None),
                 (simple(parameters={"priority": 3}), {}, "low", None),
                 (simple(priority="high", parameters={"priority": 1, "timeout": 5_000_000}),
                  {"X-Request-Timeout": "5"}, "high", 5.0),
                 (simple(parameters={"priority": 0, "timeout": 2_500_000}), {}, None, 2.5),
                 (simple(timeout_s=7), {}, None, 7.0)]
        for body, headers, priority, deadline in cases:
            record = (await client.get(
                f"/v1/result/{await accepted(client, body, headers=headers)}")).json()
            assert record.get("priority") == priority, body
            if deadline is None:
                assert "deadline_at" not in record
            else:
                assert record["deadline_at"] - record["created_at"] == pytest.approx(deadline,
                                                                                     abs=0.01)


async def test_a_repeat_is_answered_from_the_cache_unless_its_id_differs(stack: Stack) -> None:
    first = await stack.result(await accepted(stack.client, simple(id="a")))
    again = await stack.result(await accepted(stack.client, simple(id="a")))
    assert again["cache"] == "hit" and again["output"] == first["output"]
    other = await stack.result(await accepted(stack.client, simple(id="b")))
    assert "cache" not in other and other["output"]["id"] == "b"
    fresh = await stack.result(await accepted(stack.client, simple(id="a"),
                                              headers={"Cache-Control": "no-cache"}))
    assert "cache" not in fresh and fresh["output"] == first["output"]


async def test_an_idempotency_key_replays_the_first_request_and_refuses_another(
        stack: Stack) -> None:
    key = {"Idempotency-Key": "tensors-1"}
    first = await submit(stack.client, simple(), headers=key)
    repeat = await submit(stack.client, simple(), headers=key)
    assert first.status_code == repeat.status_code == 202, repeat.text
    assert repeat.json()["task_id"] == first.json()["task_id"]
    assert repeat.headers["idempotent-replayed"] == "true"
    for other in (simple(RIGHT, LEFT), simple(id="else"), simple(outputs=[{"name": "OUTPUT0"}])):
        reused = await submit(stack.client, other, headers=key)
        assert reused.status_code == 422, reused.text
        assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert outputs(await stack.result(first.json()["task_id"]))


async def test_prefer_wait_answers_the_finished_record(stack: Stack) -> None:
    answer = await submit(stack.client, simple(), headers={"Prefer": "wait=20"})
    assert answer.status_code == 200, answer.text
    assert outputs(answer.json())["OUTPUT0"]["data"] == (LEFT + RIGHT).flatten().tolist()


async def test_a_queued_tensor_task_is_cancelled(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        task_id = await accepted(client, simple())
        cancelled = await client.delete(f"/v1/result/{task_id}")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "CANCELLED"
    assert stream_lengths(redis_client) == 0 and backlog_counts(redis_client) == 0


async def test_a_tensor_task_belongs_to_its_client(
        redis_url: str, triton_server: TritonServer) -> None:
    url = triton_server.grpc_url
    async with running_stack(keyed(redis_url, url), batcher_settings(redis_url, url)) as stack:
        assert (await submit(stack.client, simple())).status_code == 401
        task_id = await accepted(stack.client, simple(), headers=ALICE)
        mine = await stack.client.get(f"/v1/result/{task_id}?wait=20", headers=ALICE)
        assert outputs(mine.json())
        theirs = await stack.client.get(f"/v1/result/{task_id}", headers=BOB)
        assert theirs.status_code == 404


async def test_a_webhook_carries_the_tensor_answer(
        redis_url: str, triton_server: TritonServer) -> None:
    calls: asyncio.Queue[tuple[dict[str, str], bytes]] = asyncio.Queue()

    async def hook(request: web.Request) -> web.Response:
        await calls.put((dict(request.headers), await request.read()))
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    common = {"webhook_allowed_hosts": "127.0.0.1", "webhook_secret": SECRET}
    url = triton_server.grpc_url
    try:
        async with running_stack(gateway_settings(redis_url, url, **common),
                                 batcher_settings(redis_url, url, **common)) as stack:
            task_id = await accepted(stack.client, simple(
                callback_url=f"http://127.0.0.1:{port}/hook"))
            headers, body = await asyncio.wait_for(calls.get(), 30)
    finally:
        await runner.cleanup()
    assert headers["Ferry-Task"] == task_id
    assert verify(SECRET, headers["Ferry-Signature"], body, time.time())
    assert outputs(orjson.loads(body))["OUTPUT0"]["data"] == (LEFT + RIGHT).flatten().tolist()
