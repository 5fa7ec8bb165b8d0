"""A task's status record: its public JSON, serialized once by whoever writes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from ferry.codec import outputs_to_json
from ferry.tasks.record import Status, StoredRecord, TaskRecord, answer_at

TASK_ID = "0123456789abcdef0123456789abcdef"


def finished_record(output: Any = None, error: str | None = None) -> TaskRecord:
    return TaskRecord(task_id=TASK_ID, status=Status.SUCCESS, model="sim",
                      created_at=1_700_000_000.125, model_version="2",
                      finished_at=1_700_000_001.5, output=output, error=error)


def pending_record() -> TaskRecord:
    return TaskRecord(task_id=TASK_ID, status=Status.PENDING, model="sim",
                      created_at=1_700_000_000.125)


# --- Status ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "final"),
    [(Status.PENDING, False), (Status.SUCCESS, True), (Status.FAILED, True),
     (Status.EXPIRED, True), (Status.CANCELLED, True)],
)
def test_status_final(status: Status, final: bool) -> None:
    assert status.final is final


def test_status_values_are_their_names() -> None:
    assert [s.value for s in Status] == ["PENDING", "SUCCESS", "FAILED", "EXPIRED", "CANCELLED"]
    assert Status("FAILED") is Status.FAILED


# --- to_json ------------------------------------------------------------------------------------


def test_to_json_omits_unset_fields() -> None:
    assert pending_record().to_json() == {"task_id": TASK_ID, "status": "PENDING",
                                          "model": "sim", "created_at": 1_700_000_000.125}


def test_to_json_includes_set_fields() -> None:
    record = finished_record(output={"OUTPUT": "ok"}, error="partial")
    assert record.to_json() == {
        "task_id": TASK_ID, "status": "SUCCESS", "model": "sim",
        "created_at": 1_700_000_000.125, "model_version": "2",
        "finished_at": 1_700_000_001.5, "output": {"OUTPUT": "ok"}, "error": "partial",
    }


def test_to_json_keeps_falsy_but_set_output_and_error() -> None:
    record = TaskRecord(task_id=TASK_ID, status=Status.FAILED, model="m", created_at=1.0,
                        finished_at=0.0, output=0, error="")
    body = record.to_json()
    assert body["finished_at"] == 0.0
    assert body["output"] == 0
    assert body["error"] == ""
    assert "model_version" not in body


def test_to_json_status_is_a_plain_string() -> None:
    status = pending_record().to_json()["status"]
    assert type(status) is str
    assert status == "PENDING"


# --- body: the bytes that are stored and served ---------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        pending_record(),
        finished_record(output={"OUTPUT": {"label": "safe", "score": 0.25}}),
        finished_record(output=["a", {"base64": "/w=="}, None, 3]),
        finished_record(output="caf\u00e9"),
        finished_record(output=0),
        finished_record(output=False),
        TaskRecord(task_id=TASK_ID, status=Status.FAILED, model="sim", created_at=1.0,
                   finished_at=2.0, error="model 'sim': max_batch_size must be > 0"),
        TaskRecord(task_id=TASK_ID, status=Status.EXPIRED, model="m", created_at=0.1 + 0.2,
                   finished_at=0.0, error=""),
    ],
)
def test_body_is_the_json_form(record: TaskRecord) -> None:
    assert orjson.loads(record.body()) == record.to_json()
    assert StoredRecord(record.status, record.body()).to_json() == record.to_json()


def test_body_keeps_float_precision() -> None:
    record = TaskRecord(task_id=TASK_ID, status=Status.SUCCESS, model="m",
                        created_at=1_712_345_678.123456, finished_at=1_712_345_678.987654)
    back = orjson.loads(record.body())
    assert back["created_at"] == 1_712_345_678.123456
    assert back["finished_at"] == 1_712_345_678.987654


def test_model_outputs_are_embedded_as_the_model_wrote_them() -> None:
    raw = b'{"id": 123456789012345678901234567890, "text": "line\\nbreak"}'
    output = outputs_to_json({"OUTPUT": [raw],
                              "SCORES": np.array([0.5, np.nan], dtype=np.float32)})
    body = finished_record(output=output).body()
    assert raw in body  # byte for byte: the big integer keeps every digit
    assert orjson.loads(body)["output"]["SCORES"] == {"shape": [2], "data": [0.5, None]}


def test_a_reusable_answer_is_the_body_from_the_model_version_on() -> None:
    record = TaskRecord("t1", Status.SUCCESS, "sim", 1.5, model_version="3", finished_at=2.0,
                        output={"y": 1}, priority="high")
    body = record.body()
    answer = body[answer_at(body) - 1:]
    assert answer == b',"model_version":"3","output":{"y":1}}'  # no finished_at, no priority
    unversioned = TaskRecord("t1", Status.SUCCESS, "sim", 1.5, finished_at=2.0, output=[1]).body()
    assert unversioned[answer_at(unversioned) - 1:] == b',"output":[1]}'
    assert answer_at(TaskRecord("t1", Status.FAILED, "sim", 1.5, error="no").body()) == 0
