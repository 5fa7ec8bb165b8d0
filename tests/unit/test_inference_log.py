"""The inference log's pure parts: which tasks are sampled (and that the share holds), its
settings, a record's fields, payloads cut and redacted, files rotated by size and age (an
injected clock), and the CloudEvents KServe's logger would send."""

from __future__ import annotations

import math
import secrets
from pathlib import Path
from typing import Any

import orjson
import pytest

from ferry.codec import encode_task
from ferry.errors import ConfigError
from ferry.inference_log.events import REQUEST_TYPE, RESPONSE_TYPE, events_of, header_value
from ferry.inference_log.record import (
    REDACTED,
    Batch,
    Shaping,
    cut,
    record_of,
    redact,
    sampled,
)
from ferry.inference_log.sinks import Entry, FileSink, Rotation, segment_name
from ferry.jobs.blobs import DirectoryStore
from ferry.queue.base import Delivery
from ferry.settings import BatcherSettings, load
from ferry.settings.inference_log import check_log_sink, log_rates, redacted_fields
from ferry.settings.services import LoggerSettings
from ferry.tasks.base import Completion
from ferry.tasks.record import Status, TaskRecord
from ferry.v1.task_pb2 import Task, Tensor

# --- sampling ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_the_sampled_share_is_within_its_binomial_bounds(rate: float) -> None:
    """Over 20,000 random task ids the share logged is the rate, within 5 standard deviations
    of a binomial count (a bound a correct hash misses about once in 3.5 million runs)."""
    n = 20_000
    logged = sum(sampled(secrets.token_hex(16), rate) for _ in range(n))
    spread = 5 * math.sqrt(n * rate * (1 - rate))
    assert abs(logged - n * rate) <= spread, (logged, n * rate)


def test_the_decision_is_the_task_ids_own() -> None:
    ids = [secrets.token_hex(16) for _ in range(500)]
    assert [sampled(i, 0.3) for i in ids] == [sampled(i, 0.3) for i in ids]
    assert all(sampled(i, 1.0) for i in ids)
    # a lower rate logs a subset of a higher one's tasks (the hash is compared with the rate)
    assert {i for i in ids if sampled(i, 0.1)} <= {i for i in ids if sampled(i, 0.3)}


# --- settings ---------------------------------------------------------------------------------


def test_log_models_are_models_and_rates() -> None:
    assert log_rates("moderation=0.1, sim=1,plain") == {"moderation": 0.1, "sim": 1.0,
                                                        "plain": 1.0}
    assert log_rates("") == {}


@pytest.mark.parametrize(("text", "complaint"), [
    ("sim=0", "is not 'model=rate'"), ("sim=1.5", "is not 'model=rate'"),
    ("sim=nan", "is not 'model=rate'"), ("sim=often", "is not 'model=rate'"),
    ("si{m}=1", "is not 'model=rate'"), ("sim=1,sim=0.5", "'sim' is given twice"),
    ("sim=1;moderation=1", "not ';'"), ("sim=1,", "an entry is empty"),
])
def test_bad_log_models_are_refused_naming_the_variable(text: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match="FERRY_LOG_MODELS") as refused:
        load(BatcherSettings, None, environ={"FERRY_LOG_MODELS": text})
    assert complaint in str(refused.value)


def test_redacted_fields_and_the_sinks_are_checked() -> None:
    assert redacted_fields("password, ssn,api key") == {"password", "ssn", "api key"}
    with pytest.raises(ConfigError, match="given twice"):
        redacted_fields("ssn,ssn")
    for sink in ("logs", "file:///var/log/ferry", "s3://bucket/prefix", "https://collector/"):
        assert check_log_sink(sink) == sink
    for sink, complaint in (("ftp://x/", "the scheme"), ("s3:///p", "names no bucket"),
                            ("", "empty"), ("file://", "names no directory")):
        with pytest.raises(ConfigError, match=complaint):
            check_log_sink(sink)
    with pytest.raises(ConfigError, match="FERRY_LOG_ROTATE_BYTES"):
        load(LoggerSettings, None, environ={"FERRY_LOG_ROTATE_BYTES": "10"})
    with pytest.raises(ConfigError, match="FERRY_LOG_MAX_RECORDS"):
        load(BatcherSettings, None, environ={"FERRY_LOG_MAX_RECORDS": "0"})


# --- records ----------------------------------------------------------------------------------


def completion(payload: bytes = b'{"text": "hi", "password": "hunter2"}', *,
               output: Any = None, error: str | None = None, model: str = "sim",
               content_type: str = "application/json", version: str = "1",
               **fields: Any) -> Completion:
    task = Task(task_id=secrets.token_hex(16), model=model, payload=payload,
                content_type=content_type, enqueued_at_ms=1_764_300_000_000,
                client_id="alice", **fields)
    status = Status.FAILED if error else Status.SUCCESS
    final = TaskRecord.final(task, status, 1_764_300_000.25, output=output, error=error,
                             model_version=version)
    delivery = Delivery(3, "ferry:{p3}:tasks", "1-0", encode_task(task), task, deliveries=2)
    return Completion(delivery, final, rows=1, gpu_us=1500)


PLAIN, BATCH = Shaping(), Batch("b1", 4)


def made(done: Completion, shaping: Shaping = PLAIN, batch: Batch = BATCH) -> dict[str, Any]:
    record: dict[str, Any] = orjson.loads(record_of(done, batch, shaping, 1_764_300_001.0))
    return record


def test_a_record_holds_the_task_its_times_its_batch_and_the_answer() -> None:
    done = completion(output={"label": "safe", "score": 0.9})
    record = made(done)
    assert done.delivery.task is not None
    assert record == {
        "id": done.delivery.task.task_id, "model": "sim", "version": "1", "client": "alice",
        "status": "SUCCESS", "priority": "normal", "created_at": 1_764_300_000.0,
        "finished_at": 1_764_300_000.25, "deadline_at": None,
        "batch": {"id": "b1", "tasks": 4, "rows": 1, "gpu_us": 1500}, "deliveries": 2,
        "request": {"content_type": "application/json",
                    "payload": {"text": "hi", "password": "hunter2"}},
        "response": {"label": "safe", "score": 0.9}, "error": None, "cut": [],
        "logged_at": 1_764_300_001.0}


def test_a_failure_is_logged_with_its_error_and_a_shadow_with_its_origin() -> None:
    record = made(completion(b"\xff\x00", content_type="image/jpeg", error="boom",
                             shadow_of="a" * 32))
    assert (record["status"], record["response"], record["error"]) == ("FAILED", None, "boom")
    assert record["request"] == {"content_type": "image/jpeg", "payload": {"base64": "/wA="}}
    assert record["shadow_of"] == "a" * 32 and "review_of" not in record
    # no version answered and none asked for (it failed before a call): null, not ""
    assert made(completion(error="no version is ready", version=""))["version"] is None


def test_a_tensor_tasks_inputs_are_logged_in_the_protocols_json_form() -> None:
    inputs = [Tensor(name="INPUT0", datatype="FP32", shape=[1, 2],
                     contents=b"\x00\x00\x80\x3f\x00\x00\x00\x40"),
              Tensor(name="TEXT", datatype="BYTES", shape=[4], contents=b"".join(
                  len(e).to_bytes(4, "little") + e
                  for e in (b"hello", b'{"a":1}', b"123", b"\xff\x00")))]
    record = made(completion(b"", inputs=inputs, outputs=["OUTPUT0"]))
    # Each BYTES element as the text it is (one that reads as JSON too: the string "123" is
    # no number), one that is not UTF-8 as {"b64": ...}, as a tensor task's answer writes it.
    assert record["request"] == {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]},
        {"name": "TEXT", "datatype": "BYTES", "shape": [4],
         "data": ["hello", '{"a":1}', "123", {"b64": "/wA="}]}],
        "outputs": ["OUTPUT0"]}


def test_named_fields_are_redacted_at_any_depth_in_requests_and_answers() -> None:
    shaping = Shaping(redacted=frozenset({"password", "ssn"}))
    record = made(completion(output={"people": [{"ssn": "1", "name": "x"}]}), shaping)
    assert record["request"]["payload"] == {"text": "hi", "password": REDACTED}
    assert record["response"] == {"people": [{"ssn": REDACTED, "name": "x"}]}
    assert redact(["password", {"a": {"password": 1}}], frozenset({"password"})) == [
        "password", {"a": {"password": REDACTED}}]  # a value is no field


def test_a_payload_over_the_cap_is_cut_with_a_marker_after_redaction() -> None:
    secret = "hunter2" * 200
    payload = orjson.dumps({"password": secret, "text": "é" * 500})
    shaping = Shaping(max_payload_bytes=200, redacted=frozenset({"password"}))
    record = made(completion(payload, output={"ok": True}), shaping)
    request = record["request"]
    assert request["cut"] is True and record["cut"] == ["request"]
    assert request["bytes"] > 1000
    assert 150 < len(orjson.dumps(request["head"])) <= 200  # written, escapes included
    assert request["head"].startswith('{"content_type":"application/json","payload":')
    assert "hunter2" not in request["head"]  # redacted before it was cut
    whole = orjson.dumps({"content_type": "application/json",
                          "payload": {"password": REDACTED, "text": "é" * 500}}).decode()
    assert whole.startswith(request["head"])  # a character cut in two is left out
    assert record["response"] == {"ok": True}  # under the cap: whole


# --- rotation ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_764_300_000.0

    def __call__(self) -> float:
        return self.now


def entries(model: str, n: int, start: int = 0) -> list[Entry]:
    return [Entry(model, f"{i}-0", orjson.dumps({"id": i, "model": model}))
            for i in range(start, start + n)]


def written(root: Path) -> dict[str, list[int]]:
    """Each committed file's records' ids, by its name under ``root``."""
    return {str(p.relative_to(root)): [orjson.loads(line)["id"] for line in
                                       p.read_bytes().splitlines()]
            for p in sorted(root.rglob("*.jsonl"))}


def test_rotation_is_due_at_its_size_or_its_age() -> None:
    rotation = Rotation(max_bytes=100, max_s=60)
    assert not rotation.due(99, opened_at=0, now=59.9)
    assert rotation.due(100, opened_at=0, now=0)
    assert rotation.due(1, opened_at=0, now=60)


async def test_files_are_committed_at_their_size_and_held_only_then(tmp_path: Path) -> None:
    clock = Clock()
    sink = FileSink(DirectoryStore(tmp_path), Rotation(max_bytes=60, max_s=300), clock)
    first = entries("sim", 2)  # 2 records of 24 bytes and a newline: under 60
    assert await sink.put(first) == []
    assert written(tmp_path) == {}  # nothing visible before it is committed
    second = entries("sim", 1, start=2)
    assert await sink.put(second) == first + second  # 75 bytes: committed, all held
    (name,) = written(tmp_path)
    assert written(tmp_path)[name] == [0, 1, 2]
    assert name.startswith("sim/2025-11-28/") and name.endswith(".jsonl")


async def test_a_file_no_record_reaches_is_committed_by_its_age(tmp_path: Path) -> None:
    clock = Clock()
    sink = FileSink(DirectoryStore(tmp_path), Rotation(max_bytes=1 << 20, max_s=300), clock)
    sim, other = entries("sim", 3), entries("other", 1, start=10)
    assert await sink.put(sim + other) == []
    clock.now += 299
    assert await sink.due() == []
    clock.now += 1
    assert sorted(await sink.due()) == sorted(sim + other)  # one file per model
    assert sorted(written(tmp_path).values()) == [[0, 1, 2], [10]]
    assert await sink.due() == []
    # the next file of a model begins with its next record
    assert await sink.put(entries("sim", 1, start=3)) == []
    clock.now += 300
    assert await sink.due() == entries("sim", 1, start=3)
    assert len(written(tmp_path)) == 3


async def test_a_discarded_file_leaves_nothing_and_close_commits_the_open_ones(
        tmp_path: Path) -> None:
    sink = FileSink(DirectoryStore(tmp_path), Rotation(max_bytes=1 << 20, max_s=300), Clock())
    await sink.put(entries("sim", 2))
    await sink.discard()
    assert written(tmp_path) == {} and not list(tmp_path.rglob(".tmp-*"))
    await sink.put(entries("sim", 1, start=5))
    assert await sink.close() == entries("sim", 1, start=5)
    assert list(written(tmp_path).values()) == [[5]]


def test_file_names_sort_by_time_and_never_collide() -> None:
    names = [segment_name("sim", 1_764_300_000.0 + s) for s in (0, 0, 61)]
    assert names[0] != names[1] and names[0].split("-")[0] == names[1].split("-")[0]
    assert names[0][:-14] < names[2][:-14]  # by the time each was opened


# --- CloudEvents ------------------------------------------------------------------------------


def test_a_record_is_the_request_and_response_events_kserves_logger_sends() -> None:
    record = made(completion(output={"label": "safe"}))
    request, response = events_of(record)
    assert request.headers["ce-type"] == REQUEST_TYPE
    assert response.headers["ce-type"] == RESPONSE_TYPE
    for event in (request, response):
        headers = event.headers
        assert headers["ce-id"] == record["id"] and headers["ce-specversion"] == "1.0"
        assert headers["ce-inferenceservicename"] == "sim"
        assert headers["ce-endpoint"] == "1" and headers["ce-component"] == "predictor"
        assert headers["ce-ferryclient"] == "alice" and headers["content-type"] == \
            "application/json"
        assert headers["ce-source"] == "/ferry/models/sim"
    assert request.headers["ce-time"] == "2025-11-28T03:20:00Z"
    assert response.headers["ce-time"] == "2025-11-28T03:20:00.250000Z"
    assert orjson.loads(request.body) == record["request"]
    assert orjson.loads(response.body) == {"label": "safe"}
    failed = made(completion(error="boom"))
    assert orjson.loads(events_of(failed)[1].body) == {"error": "boom"}


def test_a_cut_payload_stays_under_the_cap_however_much_escaping_it_takes() -> None:
    text = orjson.dumps("\x00" * 1000)  # each character written as \u0000: six bytes
    marker = cut(text, 100)
    assert marker["bytes"] == len(text) and len(orjson.dumps(marker["head"])) <= 100
    assert marker["head"].startswith('"\\u0000')


def test_header_values_are_percent_encoded_where_the_binding_says() -> None:
    assert header_value("a b\"c%d/é") == "a%20b%22c%25d/%C3%A9"
    assert header_value("alice@x.example:1+2=3") == "alice@x.example:1+2=3"
