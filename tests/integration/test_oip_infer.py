"""Triton's infer on the gateway: ``tritonclient.http`` pointed at Ferry gets the answers the
same client gets from Triton's own HTTP port, queued and batched; a request that does not fit
its model is a 400 that says what differs, and nothing is enqueued for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from ferry.stack.ports import LOOPBACK
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Served,
    backlog_counts,
    stream_lengths,
    task_keys,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]




@pytest.fixture
def client(ferry: Served) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http.InferenceServerClient(ferry.address, network_timeout=60) as ferry_client:
        yield ferry_client


def simple_inputs(binary: bool, rows: int = 1) -> list[triton_http.InferInput]:
    data = np.arange(16 * rows, dtype=np.float32).reshape(rows, 16)
    inputs = []
    for name, values in (("INPUT0", data), ("INPUT1", np.full_like(data, 2.5))):
        tensor = triton_http.InferInput(name, [rows, 16], "FP32")
        tensor.set_data_from_numpy(values, binary_data=binary)
        inputs.append(tensor)
    return inputs


def test_sim_answers_as_triton(client: triton_http.InferenceServerClient,
                               triton: triton_http.InferenceServerClient) -> None:
    tensor = triton_http.InferInput("INPUT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"hello ferry"]], dtype=np.object_))
    ours = client.infer("sim", [tensor], request_id="r-1")
    theirs = triton.infer("sim", [tensor], request_id="r-1")
    assert ours.as_numpy("OUTPUT").tolist() == theirs.as_numpy("OUTPUT").tolist()
    assert ours.get_response()["id"] == "r-1"
    assert ours.get_response()["model_name"] == "sim"


@pytest.mark.parametrize("binary", [False, True])
def test_simple_answers_as_triton(client: triton_http.InferenceServerClient,
                                  triton: triton_http.InferenceServerClient, binary: bool) -> None:
    outputs = [triton_http.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    ours = client.infer("simple", simple_inputs(binary, rows=3), outputs=outputs,
                        request_id="sum-and-diff")
    theirs = triton.infer("simple", simple_inputs(binary, rows=3), outputs=outputs,
                          request_id="sum-and-diff")
    assert ours.get_response()["id"] == "sum-and-diff"
    assert [o["name"] for o in ours.get_response()["outputs"]] == ["OUTPUT1"]
    assert np.array_equal(ours.as_numpy("OUTPUT1"), theirs.as_numpy("OUTPUT1"))
    both = client.infer("simple", simple_inputs(binary), priority=1, timeout=30_000_000)
    assert np.array_equal(both.as_numpy("OUTPUT0"), np.arange(16).reshape(1, 16) + 2.5)


def test_an_unknown_model_is_refused_as_triton_refuses_it(
        client: triton_http.InferenceServerClient,
        triton: triton_http.InferenceServerClient) -> None:
    refusals = []
    for server in (client, triton):
        with pytest.raises(InferenceServerException) as refused:
            server.infer("no_such_model", simple_inputs(False))
        refusals.append((refused.value.status(), refused.value.message()))
    assert refusals[0] == refusals[1]


@pytest.mark.parametrize("body", [b'{"inputs": []}', b"{}", b"{inputs",
                                  b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", '
                                  b'"shape": [1, 1], "data": [1.0]}]}'],
                         ids=["no inputs", "no list", "not JSON", "wrong inputs"])
@pytest.mark.parametrize("path", ["/v2/models/nope/infer", "/v2/models/simple/versions/7/infer",
                                  "/v2/models/nope/versions/1/infer"])
def test_an_unknown_model_or_version_is_refused_before_its_inputs(
        ferry: Served, triton_server: TritonServer, path: str, body: bytes) -> None:
    ours = httpx.post(f"{ferry.http}{path}", content=body)
    theirs = httpx.post(f"http://{LOOPBACK}:{triton_server.ports.http}{path}", content=body)
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())
    assert ours.status_code == 404


@pytest.mark.parametrize(("model", "body", "kind"), [
    ("sim", b"hello", "text/plain"),
    ("mix", b'{"inputs": [{"name": "VALUES", "datatype": "FP32", "shape": [1, 4], '
            b'"data": [1, 2, 3, 4]}, {"name": "STEPS", "datatype": "INT32", "shape": [1, 2], '
            b'"data": [1, 2]}]}', "application/json")], ids=["payload", "tensors"])
def test_v1_names_an_unknown_version_once_in_tritons_words(
        ferry: Served, triton_server: TritonServer, model: str, body: bytes, kind: str) -> None:
    ours = httpx.post(f"{ferry.http}/v1/inference?model={model}&version=7", content=body,
                      headers={"Content-Type": kind})
    theirs = httpx.get(f"http://{LOOPBACK}:{triton_server.ports.http}/v2/models/{model}"
                       "/versions/7").json()["error"]
    assert ours.status_code == 404, ours.text
    assert ours.json()["error"]["message"] == theirs  # "... 'sim' version 7 is not found"


def _json(inputs: list[dict[str, Any]], **more: Any) -> bytes:
    return json.dumps({"inputs": inputs, **more}).encode()


def _fp32(name: str, shape: list[int], count: int | None = None) -> dict[str, Any]:
    n = count if count is not None else int(np.prod(shape))
    return {"name": name, "datatype": "FP32", "shape": shape, "data": [1.0] * n}


GOOD = [_fp32("INPUT0", [1, 16]), _fp32("INPUT1", [1, 16])]
HEADER = _json([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                 "parameters": {"binary_data_size": 64}}, _fp32("INPUT1", [1, 16])])
BAD: dict[str, tuple[bytes, dict[str, str], str]] = {
    "wrong datatype": (_json([{**GOOD[0], "datatype": "INT32", "data": [1] * 16}, GOOD[1]]),
                       {}, "datatype INT32"),
    "wrong shape": (_json([_fp32("INPUT0", [1, 8]), GOOD[1]]), {}, "shape [1, 8]"),
    "byte count": (_json([_fp32("INPUT0", [1, 16], 15), GOOD[1]]), {}, "INPUT0"),
    "truncated binary body": (HEADER + bytes(60), {"Inference-Header-Content-Length":
                                                   str(len(HEADER))}, "truncated"),
    "header past the body": (HEADER, {"Inference-Header-Content-Length": "9999"},
                             "past the end"),
    "unknown output": (_json(GOOD, outputs=[{"name": "OUTPUT9"}]), {}, "no output 'OUTPUT9'"),
    "unknown input": (_json([*GOOD, _fp32("INPUT7", [1, 16])]), {}, "no input 'INPUT7'"),
    "missing input": (_json(GOOD[:1]), {}, "'INPUT1' is missing"),
    "rows over max_batch_size": (_json([_fp32("INPUT0", [9, 16]), _fp32("INPUT1", [9, 16])]),
                                 {}, "max_batch_size"),
    "not JSON": (b"{inputs", {}, "not valid JSON"),
    "sequence": (_json(GOOD, parameters={"sequence_id": 7}), {}, "sequences"),
    "bad priority": (_json(GOOD, parameters={"priority": -1}), {}, "'priority'"),
    "bad timeout": (_json(GOOD, parameters={"timeout": "soon"}), {}, "'timeout'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_request_is_refused_and_nothing_is_enqueued(ferry: Served, store: redis.Redis,
                                                          case: str) -> None:
    body, headers, reason = BAD[case]
    before = (len(task_keys(store)), stream_lengths(store), backlog_counts(store))
    answer = httpx.post(f"{ferry.http}/v2/models/simple/infer", content=body,
                        headers=headers, timeout=30)
    assert answer.status_code == 400, answer.text
    assert reason in answer.json()["error"]
    assert (len(task_keys(store)), stream_lengths(store), backlog_counts(store)) == before


def test_an_oversized_body_is_413(ferry: Served) -> None:
    answer = httpx.post(f"{ferry.http}/v2/models/simple/infer", content=bytes(70 * 1024),
                        timeout=30)
    assert answer.status_code == 413, answer.text
    assert "limit" in answer.json()["error"]


def test_respond_async_answers_202_and_the_record_holds_the_answer(ferry: Served) -> None:
    body = _json(GOOD, id="later")
    answer = httpx.post(f"{ferry.http}/v2/models/simple/infer", content=body,
                        headers={"Prefer": "respond-async"}, timeout=30)
    assert answer.status_code == 202, answer.text
    task_id = answer.json()["task_id"]
    assert answer.headers["location"] == f"/v1/result/{task_id}"
    record = httpx.get(f"{ferry.http}/v1/result/{task_id}", params={"wait": 20},
                       timeout=30).json()
    assert record["task_id"] == task_id
    assert record["status"] == "SUCCESS", record
    outputs = {o["name"]: o["data"] for o in record["output"]["outputs"]}
    assert outputs == {"OUTPUT0": [2.0] * 16, "OUTPUT1": [0.0] * 16}
    assert record["output"]["id"] == "later"


def test_answers_are_compressed_as_accepted(ferry: Served) -> None:
    answer = httpx.post(f"{ferry.http}/v2/models/simple/infer", content=_json(GOOD),
                        headers={"Accept-Encoding": "gzip"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.json()["outputs"][0]["data"] == [2.0] * 16
