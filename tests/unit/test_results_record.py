"""A task's status record: Redis hash fields and public JSON."""

from __future__ import annotations

from typing import Any

import pytest

from ferry.results.base import ResultRecord, Status

TASK_ID = "0123456789abcdef0123456789abcdef"


def finished_record(output: Any = None, error: str | None = None) -> ResultRecord:
    return ResultRecord(task_id=TASK_ID, status=Status.SUCCESS, model="sim",
                        created_at=1_700_000_000.125, model_version="2",
                        finished_at=1_700_000_001.5, output=output, error=error)


def pending_record() -> ResultRecord:
    return ResultRecord(task_id=TASK_ID, status=Status.PENDING, model="sim",
                        created_at=1_700_000_000.125)


# --- Status ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "final"),
    [(Status.PENDING, False), (Status.SUCCESS, True), (Status.FAILED, True),
     (Status.EXPIRED, True)],
)
def test_status_final(status: Status, final: bool) -> None:
    assert status.final is final


def test_status_values_are_their_names() -> None:
    assert [s.value for s in Status] == ["PENDING", "SUCCESS", "FAILED", "EXPIRED"]
    assert Status("FAILED") is Status.FAILED


# --- to_fields / from_fields --------------------------------------------------------------------


def test_pending_to_fields() -> None:
    assert pending_record().to_fields() == {"status": "PENDING", "model": "sim",
                                            "model_version": "",
                                            "created_at": "1700000000.125"}


def test_finished_to_fields() -> None:
    record = finished_record(output={"OUTPUT": {"sha256": "ab", "length": 3}})
    assert record.to_fields() == {
        "status": "SUCCESS", "model": "sim", "model_version": "2",
        "created_at": "1700000000.125", "finished_at": "1700000001.5",
        "output": '{"OUTPUT":{"sha256":"ab","length":3}}',
    }


def test_to_fields_values_are_all_strings() -> None:
    fields = finished_record(output=[1, 2], error="boom").to_fields()
    assert all(isinstance(v, str) for v in fields.values())
    assert fields["error"] == "boom"


@pytest.mark.parametrize(
    "record",
    [
        pending_record(),
        finished_record(output={"OUTPUT": {"label": "safe", "score": 0.25}}),
        finished_record(output=["a", {"base64": "/w=="}, None, 3]),
        finished_record(output="caf\u00e9"),
        finished_record(output=0),
        finished_record(output=False),
        ResultRecord(task_id=TASK_ID, status=Status.FAILED, model="sim", created_at=1.0,
                     finished_at=2.0, error="model 'sim': max_batch_size must be > 0"),
        ResultRecord(task_id=TASK_ID, status=Status.EXPIRED, model="m", created_at=0.1 + 0.2,
                     finished_at=0.0, error=""),
    ],
)
def test_fields_round_trip(record: ResultRecord) -> None:
    assert ResultRecord.from_fields(TASK_ID, record.to_fields()) == record


def test_round_trip_keeps_float_precision() -> None:
    record = ResultRecord(task_id=TASK_ID, status=Status.SUCCESS, model="m",
                          created_at=1_712_345_678.123456, finished_at=1_712_345_678.987654)
    back = ResultRecord.from_fields(TASK_ID, record.to_fields())
    assert back.created_at == 1_712_345_678.123456
    assert back.finished_at == 1_712_345_678.987654


def test_from_fields_with_only_a_status() -> None:
    record = ResultRecord.from_fields(TASK_ID, {"status": "PENDING"})
    assert record == ResultRecord(task_id=TASK_ID, status=Status.PENDING, model="",
                                  created_at=0.0)


def test_from_fields_empty_finished_at_is_unset() -> None:
    record = ResultRecord.from_fields(TASK_ID, {"status": "FAILED", "finished_at": ""})
    assert record.finished_at is None


def test_from_fields_unknown_status_raises() -> None:
    with pytest.raises(ValueError, match="'DONE' is not a valid Status"):
        ResultRecord.from_fields(TASK_ID, {"status": "DONE"})


def test_from_fields_without_status_raises() -> None:
    with pytest.raises(KeyError):
        ResultRecord.from_fields(TASK_ID, {"model": "sim"})


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
    record = ResultRecord(task_id=TASK_ID, status=Status.FAILED, model="m", created_at=1.0,
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
