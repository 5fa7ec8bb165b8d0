"""``/v1/inference``'s tensor form: which JSON bodies it is, how its priority and deadline are
agreed between ``/v1`` and the request's parameters, and what identical requests share."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from ferry.errors import ClientError
from ferry.gateway.intake import parse_submission
from ferry.oip.schedule import TensorTask
from ferry.oip.spec import CheckedRequest
from ferry.priority import Priority
from ferry.submission import Submission, TensorSubmission
from ferry.tensors import Tensor

JSON = "application/json"
INPUT = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.5]}


def parsed(body: dict[str, Any], query: dict[str, str] | None = None,
           timeout: str | None = None, model: str | None = "simple") -> Submission:
    return parse_submission(orjson.dumps(body), JSON, model, query or {}, timeout)


def refused(body: dict[str, Any], query: dict[str, str] | None = None,
            timeout: str | None = None) -> ClientError:
    with pytest.raises(ClientError) as info:
        parsed(body, query, timeout)
    return info.value


def test_a_body_with_inputs_is_the_tensor_form() -> None:
    submission = parsed({"inputs": [INPUT], "outputs": [{"name": "OUTPUT0"}], "id": "r",
                         "client_id": "me", "callback_url": "http://hooks/x"},
                        {"version": "3"})
    assert isinstance(submission, TensorSubmission)
    form = submission.tensors
    assert form.version == "3"
    assert form.request.id == "r" and form.request.output_names == ("OUTPUT0",)
    assert form.request.inputs[0].raw == b"\x00\x00\x80?\x00\x00 @"
    assert (submission.model, submission.payload, submission.client_id,
            submission.callback_url) == ("simple", b"", "me", "http://hooks/x")


def test_a_payload_body_is_what_it_was() -> None:
    submission = parsed({"input": "hello", "model": "sim"})
    assert not isinstance(submission, TensorSubmission) and submission.payload == b"hello"
    assert refused({"input": "hello", "input_tensors": []}).code == "unknown_field"
    assert parsed({"input": "x"}, {"version": "1"}).version == "1"  # a payload pins one too
    assert parsed({"input": "x", "model_version": "2"}).version == "2"
    assert refused({"input": "x", "model_version": "2"}, {"version": "1"}).code == \
        "invalid_parameter"
    assert refused({"input": "x", "model_version": "v2"}).code == "invalid_parameter"
    raw = parse_submission(b"{\"inputs\": 1}", "text/plain", "sim")
    assert not isinstance(raw, TensorSubmission) and raw.payload == b"{\"inputs\": 1}"


@pytest.mark.parametrize(("body", "code"), [
    ({"inputs": [INPUT], "input": "x"}, "ambiguous_input"),
    ({"inputs": [INPUT], "input_base64": "eA=="}, "ambiguous_input"),
    ({"inputs": [INPUT], "stream": True}, "unknown_field"),
    ({"inputs": []}, "invalid_tensors"),
    ({"inputs": None}, "invalid_tensors"),
    ({"inputs": [{**INPUT, "data": [1.0]}]}, "invalid_tensors"),
    ({"inputs": [INPUT], "id": 5}, "invalid_tensors"),
    ({"inputs": [INPUT], "parameters": {"sequence_id": 1}}, "invalid_tensors"),
    ({"inputs": [INPUT], "parameters": {"timeout": -1}}, "invalid_tensors"),
    ({"inputs": [INPUT], "model": ""}, "invalid_field"),
    ({"inputs": [INPUT], "priority": "urgent"}, "invalid_priority"),
    ({"inputs": [INPUT], "timeout_s": "soon"}, "invalid_timeout"),
])
def test_what_the_tensor_form_refuses(body: dict[str, Any], code: str) -> None:
    error = refused(body)
    assert (error.status, error.code) == (400, code)


@pytest.mark.parametrize("version", ["", "v1", "1.0", "-1", "1" * 19, "\u0661"])
def test_a_version_is_a_number(version: str) -> None:
    assert refused({"inputs": [INPUT]}, {"version": version}).code == "invalid_parameter"


@pytest.mark.parametrize(("ours", "parameter", "priority"), [
    ({}, {}, Priority.NORMAL), ({}, {"priority": 0}, Priority.NORMAL),
    ({}, {"priority": 1}, Priority.HIGH), ({}, {"priority": 2}, Priority.NORMAL),
    ({}, {"priority": 7}, Priority.LOW), ({"query": "low"}, {}, Priority.LOW),
    ({"body": "high"}, {"priority": 1}, Priority.HIGH),
    ({"query": "normal"}, {"priority": 2}, Priority.NORMAL),
    ({"query": "high"}, {"priority": 0}, Priority.HIGH),
    ({"body": "low", "query": "high"}, {}, Priority.LOW),
])
def test_the_priority_is_v1s_or_the_requests(ours: dict[str, str], parameter: dict[str, int],
                                             priority: Priority) -> None:
    body: dict[str, Any] = {"inputs": [INPUT], "parameters": parameter}
    if "body" in ours:
        body["priority"] = ours["body"]
    query = {"priority": ours["query"]} if "query" in ours else {}
    assert parsed(body, query).priority is priority


@pytest.mark.parametrize(("body", "query"), [
    ({"parameters": {"priority": 1}}, {"priority": "normal"}),
    ({"parameters": {"priority": 3}, "priority": "high"}, {}),
])
def test_priorities_that_disagree_are_refused(body: dict[str, Any],
                                              query: dict[str, str]) -> None:
    error = refused({"inputs": [INPUT], **body}, query)
    assert error.code == "invalid_priority" and "set one, or both alike" in error.message


@pytest.mark.parametrize(("timeout_s", "header", "microseconds", "deadline"), [
    (None, None, 0, None), (None, None, 1_500_000, 1.5), (2.0, None, 0, 2.0),
    (None, "0.1", 100_000, 0.1), (9.0, "3", 3_000_000, 3.0), (None, "4", 0, 4.0),
])
def test_the_deadline_is_v1s_or_the_requests(timeout_s: float | None, header: str | None,
                                             microseconds: int,
                                             deadline: float | None) -> None:
    body: dict[str, Any] = {"inputs": [INPUT], "parameters": {"timeout": microseconds}}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    assert parsed(body, timeout=header).timeout_s == deadline


def test_deadlines_that_disagree_are_refused() -> None:
    body = {"inputs": [INPUT], "parameters": {"timeout": 1_000_001}}
    assert refused(body, timeout="1").code == "invalid_timeout"
    assert refused({**body, "timeout_s": 1}).code == "invalid_timeout"
    assert refused({**body, "timeout_s": 0}).code == "invalid_timeout"


def _task(request_id: str = "", version: str = "", newest: str = "",
          own_id: bool = True) -> TensorTask:
    tensor = Tensor("X", "UINT8", (1, 2), b"ab")
    return TensorTask(CheckedRequest("m", version, (tensor,), ("A",), 1, True), request_id,
                      newest=newest, own_id=own_id)


def test_an_answer_kept_as_it_is_is_shared_only_with_the_same_id() -> None:
    assert _task("a").digest == _task("a").digest != _task("b").digest
    assert _task("").digest != _task("a").digest
    assert _task("a", own_id=False).digest == _task("b", own_id=False).digest
    outputs_not_id = TensorTask(replace(_task().request, outputs=("A", "id")))
    assert outputs_not_id.digest != _task("A").digest


def test_the_newest_version_keys_the_cache_not_the_request() -> None:
    first, second = _task(newest="1"), _task(newest="2")
    assert first.version == "1" and first.digest != second.digest
    assert first.request_digest == second.request_digest == _task().digest
    pinned = _task(version="2", newest="3")
    assert pinned.version == "2" and pinned.digest == pinned.request_digest == second.digest
