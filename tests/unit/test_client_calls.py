"""The client's calls and answers without a server: error mapping, the idempotency key every
retry of a submission carries, the request each method builds, the results cursor. HTTP is
answered by httpx's MockTransport (the client's own retry loop runs; ``Retry-After: 0`` keeps it
fast)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from ferry.client import Client, RetryPolicy, TaskStatus
from ferry.client import errors as e
from ferry.client.calls import Cursor, Follower, Inference, Page, inference, manifest_content
from ferry.client.records import JobStatus, ResultLine
from ferry.jobs.model import JobStatus as ServerJobStatus
from ferry.tasks.record import Status

FAST = RetryPolicy(attempts=5, deadline_s=10, base_delay_s=0.0, max_delay_s=0.0)
RECORD = {"task_id": "a" * 32, "status": "SUCCESS", "model": "sim", "created_at": 1.0,
          "finished_at": 2.0, "model_version": "1", "output": {"OUTPUT": {"length": 1}}}


def refusal(status: int, code: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(status, headers=headers,
                          json={"error": {"code": code, "message": f"{code}!"}})


def client_answering(answer: Callable[[httpx.Request, int], httpx.Response],
                     seen: list[httpx.Request]) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request, len(seen))
    return Client("http://ferry.test", retry=FAST, transport=httpx.MockTransport(handler))


def test_every_documented_code_has_its_class_under_its_kind() -> None:
    cases = {(400, "malformed_json"): e.MalformedJsonError,
             (404, "unknown_task"): e.UnknownTaskError,
             (409, "already_running"): e.AlreadyRunningError,
             (413, "too_many_items"): e.TooManyItemsError,
             (429, "too_many_items"): e.TooManyItemsError,
             (429, "backlog_full"): e.BacklogFullError,
             (401, "invalid_api_key"): e.InvalidApiKeyError,
             (503, "circuit_open"): e.CircuitOpenError,
             (500, "internal_error"): e.InternalError}
    for (status, code), cls in cases.items():
        error = e.error_from_answer(status, {"error": {"code": code, "message": "m"}}, 2.0)
        assert type(error) is cls and (error.code, error.status, error.retry_after) == (
            code, status, 2.0)
    assert isinstance(e.error_from_answer(429, {"error": {"code": "rate_limited"}}, None),
                      e.OverloadedError)
    assert issubclass(e.IdempotencyKeyReusedError, e.InvalidRequestError)


def test_an_unknown_code_or_body_gets_its_status_kind() -> None:
    error = e.error_from_answer(409, {"error": {"code": "brand_new", "message": "x",
                                                "lines": [1]}}, None)
    assert type(error) is e.ConflictError and error.code == "brand_new"
    assert error.details == {"lines": [1]} and str(error) == "409 brand_new: x"
    assert type(e.error_from_answer(502, "not json", None)) is e.FerryError
    assert e.error_from_answer(404, None, None).code == "http_404"


def test_the_codes_of_docs_api_md_are_all_known() -> None:
    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    table = api[api.index("| status | code | when |"):api.index("An error message quotes")]
    rows = [row for row in table.splitlines()[2:] if row.startswith("|")]
    codes = {c for row in rows for c in row.split("|")[2].split("`")[1::2]}
    assert len(codes) > 40
    assert codes - set(e.BY_CODE) == set()


def test_every_retry_of_a_submission_carries_the_same_idempotency_key() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request, n: int) -> httpx.Response:
        if n == 1:
            raise httpx.ConnectError("refused", request=request)
        if n == 2:
            return refusal(429, "backlog_full", "0")
        if n == 3:
            return refusal(503, "unavailable", "0")
        return httpx.Response(200, json=RECORD)

    with client_answering(answer, seen) as client:
        record = client.infer("sim", "x", priority="high", timeout=5)
    assert record.status is TaskStatus.SUCCESS and record.output == RECORD["output"]
    keys = {r.headers["idempotency-key"] for r in seen}
    assert len(seen) == 4 and len(keys) == 1 and len(keys.pop()) == 32
    assert seen[0].url.params["priority"] == "high" and seen[0].headers["prefer"] == "wait=30"
    assert seen[0].headers["x-request-timeout"] == "5"


def test_a_caller_key_is_sent_and_other_4xx_are_not_retried() -> None:
    seen: list[httpx.Request] = []
    reused = client_answering(lambda r, n: refusal(422, "idempotency_key_reused"), seen)
    with reused as client, pytest.raises(e.IdempotencyKeyReusedError) as raised:
        client.submit("sim", b"x", idempotency_key="mine")
    assert len(seen) == 1 and seen[0].headers["idempotency-key"] == "mine"
    assert raised.value.status == 422


def test_retries_end_with_the_last_refusal_and_its_retry_after() -> None:
    seen: list[httpx.Request] = []
    limited = client_answering(lambda r, n: refusal(429, "rate_limited", "0"), seen)
    with limited as client, pytest.raises(e.RateLimitedError) as raised:
        client.status("t")
    assert len(seen) == FAST.attempts and raised.value.retry_after == 0.0


def test_a_connection_that_never_comes_raises_connection_failed() -> None:
    def answer(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    seen: list[httpx.Request] = []
    with client_answering(answer, seen) as client, pytest.raises(e.ConnectionFailedError):
        client.cancel("t")
    assert len(seen) == FAST.attempts


def test_a_202_is_followed_with_held_gets_until_the_task_ends() -> None:
    seen: list[httpx.Request] = []
    pending = {**RECORD, "status": "PENDING"}

    def answer(request: httpx.Request, n: int) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"task_id": RECORD["task_id"]})
        return httpx.Response(200, json=pending if n == 2 else RECORD)

    with client_answering(answer, seen) as client:
        assert client.infer("sim", "x").ok
    assert [r.method for r in seen] == ["POST", "GET", "GET"]
    assert all(r.url.params["wait"] == "30" for r in seen[1:])


def test_a_payload_or_tensors_each_get_their_body() -> None:
    text = inference("hi", None, Inference(model="sim", version=2))
    assert text.content == b"hi" and text.headers["Content-Type"].startswith("text/plain")
    assert text.params == {"model": "sim", "version": "2"} and "Prefer" not in text.headers
    image = inference(b"\xff", None, Inference(content_type="image/jpeg"), hold_s=2.5)
    assert image.headers["Content-Type"] == "image/jpeg"
    assert image.headers["Prefer"] == "wait=2.5"  # fractions kept
    tensors = [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]
    form = inference(None, tensors, Inference())
    assert isinstance(form.content, bytes)
    assert orjson.loads(form.content) == {"inputs": tensors}
    with pytest.raises(ValueError, match="either"):
        inference("x", tensors, Inference())


def test_a_manifest_is_a_file_streamed_or_items_encoded(tmp_path: Path) -> None:
    assert manifest_content(str(tmp_path / "m.jsonl")) == tmp_path / "m.jsonl"
    items: Any = ({"custom_id": str(i), "input": "x"} for i in range(2))
    assert manifest_content(items) == (b'{"custom_id":"0","input":"x"}\n'
                                       b'{"custom_id":"1","input":"x"}\n')


def line(n: int) -> ResultLine:
    return ResultLine(custom_id=f"i{n}", line=n, status="succeeded")


def test_the_cursor_moves_past_each_line_and_to_the_next_page_after_the_last() -> None:
    page = Page([line(1), line(2), line(3)], next_segments=5, job_status=JobStatus.RUNNING)
    follower = Follower(Cursor(2))
    taken = follower.take(page)
    assert next(taken) == line(1) and str(follower.cursor) == "2+1"
    assert next(taken) == line(2) and str(follower.cursor) == "2+2"
    assert next(taken) == line(3) and str(follower.cursor) == "5"
    resumed = Follower(Cursor.parse("2+2"))
    assert list(resumed.take(page)) == [line(3)] and resumed.cursor == Cursor(5)
    empty = Follower(Cursor(5))
    assert list(empty.take(Page([], 5, JobStatus.RUNNING))) == [] and empty.cursor == Cursor(5)


def test_a_cursor_is_read_back_from_its_text() -> None:
    assert Cursor.parse(None) == Cursor() and Cursor.parse("7") == Cursor(7)
    assert Cursor.parse(str(Cursor(3, 4))) == Cursor(3, 4)
    with pytest.raises(ValueError, match="cursor"):
        Cursor.parse("x+1")


def test_a_gateway_that_holds_less_long_is_asked_less_after_its_first_refusal() -> None:
    def answer(request: httpx.Request, n: int) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"task_id": "a" * 32})
        if float(request.url.params["wait"]) > 5:  # FERRY_MAX_POLL_S=5, as the gateway says
            return httpx.Response(400, json={"error": {
                "code": "invalid_wait",
                "message": "'wait' must be between 0 and 5 seconds, got 30"}})
        return httpx.Response(200, json=RECORD if n > 3 else {**RECORD, "status": "PENDING"})
    seen: list[httpx.Request] = []
    with client_answering(answer, seen) as client:
        assert client.infer("sim", "x").ok
        assert client.max_hold_s == 5.0
    assert [r.url.params.get("wait") for r in seen[1:]] == ["30", "5", "5"]


def test_a_jobs_retry_is_not_sent_again_once_it_may_have_arrived() -> None:
    def answer(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.ReadError("the answer was lost", request=request)
    seen: list[httpx.Request] = []
    with client_answering(answer, seen) as client, pytest.raises(e.ConnectionFailedError):
        client.retry_job("j" * 32)
    assert len(seen) == 1  # a second one would run the job's failed items again
    seen.clear()
    with client_answering(lambda request, n: refusal(503, "unavailable", "0"), seen) as client, \
            pytest.raises(e.UnavailableError):
        client.retry_job("j" * 32)
    assert len(seen) == 1  # a 503 may come after the job moved: not repeated either
    seen.clear()
    with client_answering(answer, seen) as client, pytest.raises(e.ConnectionFailedError):
        client.status("a" * 32)
    assert len(seen) == FAST.attempts  # a read is repeated


def test_the_clients_own_mistake_is_raised_at_once() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.UnsupportedProtocol("no scheme", request=request)
    with client_answering(answer, seen) as client, pytest.raises(e.ConnectionFailedError):
        client.status("a" * 32)
    assert len(seen) == 1


def test_a_running_jobs_final_results_are_refused_and_stripped_headers_said() -> None:
    line = b'{"line":1,"custom_id":"a","status":"SUCCESS","output":{}}\n'

    def running(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(200, content=line, headers={"Ferry-Job-Status": "running"})
    with client_answering(running, []) as client, pytest.raises(e.FerryError) as refused:
        client.final_results("j" * 32)
    assert refused.value.code == "job_not_ended"

    def stripped(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(200, content=line)  # a proxy dropped Ferry's headers
    with client_answering(stripped, []) as client, pytest.raises(e.FerryError) as lost:
        list(client.job_results("j" * 32))
    assert lost.value.code == "missing_headers"


def test_the_clients_statuses_are_the_servers() -> None:
    """The client keeps its own copies (it imports no server module): they must not drift."""
    assert [s.value for s in TaskStatus] == [s.value for s in Status]
    assert [s.value for s in JobStatus] == [s.value for s in ServerJobStatus]
    assert {s.value for s in JobStatus if s.final} == {s.value for s in ServerJobStatus
                                                        if s.final}
    assert {s.value for s in TaskStatus if s.final} == {s.value for s in Status if s.final}
