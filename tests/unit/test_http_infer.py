"""Triton's infer call over HTTP: the request bodies, the reply parser and the refusals
(pure; the client against a real tritonserver is in tests/integration/test_http_data_plane.py)."""

from __future__ import annotations

import json

import pytest

from ferry.errors import PermanentBackendError, TransientBackendError, UnknownModelError
from ferry.tensors import Tensor, pack_bytes
from ferry.triton.http_infer import (
    bytes_batch_body,
    infer_path,
    parse_reply,
    refusal,
    tensor_body,
)


def test_the_path_names_the_version_only_when_one_is_pinned_and_quotes_names() -> None:
    assert infer_path("sim") == "/v2/models/sim/infer"
    assert infer_path("sim", "2") == "/v2/models/sim/versions/2/infer"
    assert infer_path("a/b c") == "/v2/models/a%2Fb%20c/infer"


def test_a_bytes_batch_is_one_binary_input_and_every_output_asked_in_binary() -> None:
    raw = pack_bytes([b"one", b"three"])
    body = bytes_batch_body("INPUT", raw, 2, ("OUTPUT", "SCORES"))
    header = json.loads(body.header)
    assert header["inputs"] == [{"name": "INPUT", "datatype": "BYTES", "shape": [2, 1],
                                 "parameters": {"binary_data_size": len(raw)}}]
    assert header["outputs"] == [{"name": n, "parameters": {"binary_data": True}}
                                 for n in ("OUTPUT", "SCORES")]
    assert body.blobs == (raw,) and body.length == len(body.header) + len(raw)


def test_a_tensor_batch_asks_all_outputs_in_binary_when_none_is_named() -> None:
    a = Tensor("INPUT0", "FP32", (2, 2), bytes(16))
    b = Tensor("INPUT1", "INT8", (2, 3), bytes(range(6)))
    header = json.loads(tensor_body([a, b], request_id="r-1").header)
    assert [(i["name"], i["datatype"], i["shape"], i["parameters"]["binary_data_size"])
            for i in header["inputs"]] == [("INPUT0", "FP32", [2, 2], 16),
                                           ("INPUT1", "INT8", [2, 3], 6)]
    assert header["id"] == "r-1" and header["parameters"] == {"binary_data_output": True}
    assert "outputs" not in header
    named = json.loads(tensor_body([a], ["OUTPUT1"]).header)
    assert named["outputs"] == [{"name": "OUTPUT1", "parameters": {"binary_data": True}}]
    assert "id" not in named and "parameters" not in named
    assert tensor_body([a, b]).blobs == (a.raw, b.raw)


def reply(outputs: list[tuple[str, str, list[int], bytes]], version: str = "3") -> bytes:
    header = {"model_name": "m", "model_version": version,
              "outputs": [{"name": n, "datatype": d, "shape": s,
                           "parameters": {"binary_data_size": len(raw)}}
                          for n, d, s, raw in outputs]}
    return json.dumps(header).encode()


def test_a_reply_splits_into_its_outputs_in_order() -> None:
    first, second = pack_bytes([b"a", b"bc"]), bytes(range(8))
    head = reply([("OUT", "BYTES", [2, 1], first), ("SCORE", "FP32", [2, 1], second)])
    parsed = parse_reply(head + first + second, len(head), "infer 'm'")
    assert parsed.model_name == "m" and parsed.model_version == "3"
    assert [(o.name, o.datatype, o.shape, o.raw) for o in parsed.outputs] == [
        ("OUT", "BYTES", (2, 1), first), ("SCORE", "FP32", (2, 1), second)]


@pytest.mark.parametrize(("body", "length", "message"), [
    (b"not json", None, "not Triton's infer JSON"),
    (b'{"outputs": [{"name": "OUT", "datatype": "FP32", "shape": [1], "data": [1.0]}]}', None,
     "came as JSON"),
    (reply([("OUT", "FP32", [2], bytes(8))]) + bytes(4), len(reply([("OUT", "FP32", [2],
                                                                      bytes(8))])), "truncated"),
    (b"{}", 10, "header longer than the reply"),
])
def test_a_reply_that_is_not_what_was_asked_is_a_permanent_error(
        body: bytes, length: int | None, message: str) -> None:
    with pytest.raises(PermanentBackendError, match=message):
        parse_reply(body, length, "infer 'm'")


@pytest.mark.parametrize(("status", "error", "kind"), [
    (404, "", UnknownModelError),
    (400, "Request for unknown model: 'x' is not found", UnknownModelError),
    (503, "Server not ready", TransientBackendError),
    (429, "", TransientBackendError),
    (400, "unexpected shape for input 'INPUT1'", PermanentBackendError),
    (500, "internal", PermanentBackendError),
])
def test_refusals_are_unknown_models_transient_or_permanent_with_the_servers_message(
        status: int, error: str, kind: type[Exception]) -> None:
    found = refusal(status, json.dumps({"error": error}).encode(), "infer 'x'")
    assert type(found) is kind
    assert found.code == f"HTTP {status}" and found.reason == (error or str(found))
    assert str(found).startswith(f"infer 'x': HTTP {status}")


def test_a_refusal_without_json_keeps_the_start_of_its_body() -> None:
    found = refusal(502, b"<html>bad gateway</html>", "infer 'x'")
    assert isinstance(found, TransientBackendError) and "bad gateway" in found.reason
