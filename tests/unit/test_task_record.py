"""A task's status record: its public JSON, serialized once by whoever writes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from ferry.codec import dumps, outputs_to_json
from ferry.tasks.record import (
    CANCELLED_ERROR,
    COLLAPSED_INTO,
    FOLLOWER_HEAD,
    Status,
    StoredRecord,
    TaskRecord,
    cancelled_tail,
    dead_letter,
    reusable,
    status_fragment,
)
from ferry.v1.task_pb2 import Task

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
    encoded = record.encode()
    assert encoded.body[encoded.answer_at:] == b',"model_version":"3","output":{"y":1}}'
    unversioned = TaskRecord("t1", Status.SUCCESS, "sim", 1.5, finished_at=2.0, output=[1])
    encoded = unversioned.encode()
    assert encoded.body[encoded.answer_at:] == b',"output":[1]}'
    assert TaskRecord("t1", Status.FAILED, "sim", 1.5, error="no").encode().answer_at == 0
    assert pending_record().encode().answer_at == 0


# --- layout: the parts the scripts join, known by construction ---------------------------------


SHAPES = [
    pending_record(),
    TaskRecord(TASK_ID, Status.PENDING, "m", 1.25, priority="low", deadline_at=9.5),
    finished_record(output={"OUTPUT": "ok"}),
    finished_record(output=[1], error="partial"),
    TaskRecord(TASK_ID, Status.FAILED, "m", 1.0, finished_at=2.0, error="boom"),
    TaskRecord(TASK_ID, Status.SUCCESS, "m", 1.0, "4", 2.0, [1], answered_by="small"),
    TaskRecord(TASK_ID, Status.SUCCESS, "m", 1.0, finished_at=1.0, cache="hit"),
    TaskRecord(TASK_ID, Status.SUCCESS, "m", 1.0, "2", 2.0, {"y": 1}, priority="high",
               collapsed_into="f" * 32),
]
KEY_ORDER = ["task_id", "created_at", "collapsed_into", "status", "model", "priority",
             "deadline_at", "finished_at", "cache", "answered_by", "model_version", "output",
             "error"]


@pytest.mark.parametrize("record", SHAPES)
def test_the_body_is_one_json_document_in_the_public_key_order(record: TaskRecord) -> None:
    body = record.encode().body
    assert body == orjson.dumps(record.to_json())
    present = list(orjson.loads(body))
    assert present == [k for k in KEY_ORDER if k in present]


@pytest.mark.parametrize("record", SHAPES)
def test_the_parts_begin_where_the_layout_says(record: TaskRecord) -> None:
    body, head_end, answer_at = record.encode()
    head = b'{"task_id":"%s","created_at":%s' % (record.task_id.encode(),
                                                 orjson.dumps(record.created_at))
    if record.collapsed_into:
        head += b',"collapsed_into":"%s"' % record.collapsed_into.encode()
    assert body[:head_end] == head
    assert body[head_end:].startswith(b',"status":')
    if answer_at:
        assert body[answer_at:].startswith((b',"model_version":', b',"output":'))
        assert b'"finished_at"' not in body[answer_at:]


def test_a_cache_hits_record_is_its_head_then_the_stored_answer() -> None:
    pending = TaskRecord(TASK_ID, Status.PENDING, "sim", 1.25, priority="high",
                         deadline_at=9.0)
    leader = TaskRecord("a" * 32, Status.SUCCESS, "sim", 1.0, "3", 2.0, {"y": 1},
                        priority="low")
    head = pending.hit_head(pending.encode())
    assert head == pending.cache_hit().encode().body[:-1]
    stored = leader.encode()
    body = head + stored.body[stored.answer_at:-1] + b"}"  # what admit.lua joins
    assert body == (b'{"task_id":"' + TASK_ID.encode() + b'","created_at":1.25,'
                    b'"status":"SUCCESS","model":"sim","finished_at":1.25,"cache":"hit",'
                    b'"model_version":"3","output":{"y":1}}')
    assert body == TaskRecord(TASK_ID, Status.SUCCESS, "sim", 1.25, "3", 1.25, {"y": 1},
                              cache="hit").body()


@pytest.mark.parametrize("same_owner", [True, False])
def test_a_followers_record_is_its_head_then_the_leaders_shared_part(same_owner: bool) -> None:
    leader_id = "b" * 32
    follower = TaskRecord(TASK_ID, Status.PENDING, "sim", 1.25).encode()
    leader = TaskRecord(leader_id, Status.SUCCESS, "sim", 1.0, "3", 2.0, [1]).encode()
    into = (COLLAPSED_INTO.decode() % leader_id).encode() if same_owner else b""
    head = (FOLLOWER_HEAD.decode() % (TASK_ID, dumps(1.25).decode())).encode()  # complete.lua's
    assert head == follower.body[:follower.head_end]
    body = head + into + leader.body[leader.head_end:]
    expected = TaskRecord(TASK_ID, Status.SUCCESS, "sim", 1.25, "3", 2.0, [1],
                          collapsed_into=leader_id if same_owner else None)
    assert body == expected.body()


def test_a_cancelled_record_swaps_the_status_and_ends_with_the_prepared_tail() -> None:
    pending = TaskRecord(TASK_ID, Status.PENDING, "sim", 1.25, priority="low",
                         deadline_at=9.0)
    body = pending.body()
    at = body.index(status_fragment(Status.PENDING))  # what cancel.lua does
    cancelled = (body[:at] + status_fragment(Status.CANCELLED)
                 + body[at + len(status_fragment(Status.PENDING)):-1] + cancelled_tail(3.5))
    assert at == pending.encode().head_end
    assert cancelled == TaskRecord(TASK_ID, Status.CANCELLED, "sim", 1.25, finished_at=3.5,
                                   error=CANCELLED_ERROR, priority="low",
                                   deadline_at=9.0).body()


# --- the rules of a final record ----------------------------------------------------------------


def envelope(**fields: Any) -> Task:
    return Task(task_id=TASK_ID, model="sim", enqueued_at_ms=1_700_000_000_125, **fields)


def test_pending_and_final_records_come_from_the_envelope() -> None:
    task = envelope(priority=1, deadline_ms=1_700_000_009_500)
    assert TaskRecord.pending(task, 1.5) == TaskRecord(
        TASK_ID, Status.PENDING, "sim", 1.5, priority="high", deadline_at=1_700_000_009.5)
    assert TaskRecord.final(task, Status.SUCCESS, 2.0, output=[1], model_version="3") == (
        TaskRecord(TASK_ID, Status.SUCCESS, "sim", 1_700_000_000.125, "3", 2.0, [1],
                   priority="high", deadline_at=1_700_000_009.5))


def test_failures_and_unreadable_entries_are_dead_lettered() -> None:
    task = envelope()
    assert dead_letter(task, Status.SUCCESS, None, None) is None
    assert dead_letter(task, Status.EXPIRED, "late", None) is None
    assert dead_letter(task, Status.FAILED, "boom", None) == "boom"
    assert dead_letter(None, Status.FAILED, None, "bad envelope") == "bad envelope"
    assert dead_letter(None, Status.FAILED, None, None) == "unreadable task"


def test_only_the_digests_own_model_and_version_answer_is_reusable() -> None:
    task = envelope(input_digest="d" * 64, digest_version="3")
    assert reusable(task, Status.SUCCESS, "3", None)
    assert not reusable(task, Status.SUCCESS, "4", None)
    assert not reusable(task, Status.SUCCESS, "3", "fallback")
    assert not reusable(task, Status.FAILED, "3", None)
    assert not reusable(envelope(), Status.SUCCESS, "", None)
    assert not reusable(None, Status.SUCCESS, "3", None)


def test_a_stored_records_deadline_is_read_only_while_it_is_pending() -> None:
    due = TaskRecord(TASK_ID, Status.PENDING, "m", 1.25, deadline_at=9.5)
    assert StoredRecord(Status.PENDING, due.body()).deadline_at == 9.5
    plain = TaskRecord(TASK_ID, Status.PENDING, "m", 1.25)
    assert StoredRecord(Status.PENDING, plain.body()).deadline_at is None
    ended = TaskRecord(TASK_ID, Status.SUCCESS, "m", 1.25, deadline_at=9.5, finished_at=2.0)
    assert StoredRecord(Status.SUCCESS, ended.body()).deadline_at is None
