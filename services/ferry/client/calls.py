"""The HTTP calls behind each client method, built and read without I/O: the sync and the
async client send the same ``Call`` and read its answer with the same functions."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from ferry.client.errors import FerryError, error_from_answer
from ferry.client.records import JobStatus, ResultLine, TaskResult
from ferry.client.retrying import retried_status, retry_after_s

DEFAULT_URL = "http://127.0.0.1:8000"
MAX_HOLD_S = 30  # the most the gateway holds a call (Prefer: wait, ?wait=)
NDJSON = "application/x-ndjson"
CHUNK = 1 << 20  # bytes of a manifest file read at a time

Payload = bytes | str
Tensors = Sequence[Mapping[str, Any]]
Manifest = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


@dataclass(frozen=True)
class Call:
    """One request: sent as it is on every attempt (the same ``Idempotency-Key`` included).
    ``content`` is the body, or a file streamed from disk on each attempt; ``hold_s`` is how
    long the gateway may hold the answer (the read timeout grows by it)."""

    method: str
    path: str
    params: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | Path | None = None
    hold_s: float = 0.0
    # Whether a try whose answer was lost may be made again: a submission (its key), a read or
    # a cancel may; a job's retry may not (it would run the job's failed items once more).
    idempotent: bool = True


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers that present ``api_key`` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def new_idempotency_key() -> str:
    """A key for a caller who gave none: 128 random bits."""
    return uuid.uuid4().hex


def _query(**values: str | int | float | None) -> dict[str, str]:
    return {name: str(value) for name, value in values.items() if value is not None}


@dataclass(frozen=True)
class Inference:
    """What one inference asks for, beside its input."""

    model: str | None = None
    priority: str | None = None
    timeout: float | None = None  # the task's deadline, seconds
    version: str | int | None = None
    client_id: str | None = None
    idempotency_key: str | None = None
    content_type: str | None = None


def _body(payload: Payload | None, tensors: Tensors | None,
          content_type: str | None) -> tuple[bytes, str]:
    if (payload is None) == (tensors is None):
        raise ValueError("give an inference either a payload (bytes or str) or tensors")
    if tensors is not None:
        return orjson.dumps({"inputs": list(tensors)}), "application/json"
    if isinstance(payload, str):
        return payload.encode(), content_type or "text/plain; charset=utf-8"
    assert payload is not None
    return payload, content_type or "application/octet-stream"


def inference(payload: Payload | None, tensors: Tensors | None, asked: Inference,
              hold_s: float = 0.0) -> Call:
    """``POST /v1/inference``: a payload as a raw body, tensors as the JSON tensor form; the
    model, version and priority in the query; the deadline in ``X-Request-Timeout``; an
    ``Idempotency-Key`` always (made here when the caller gave none)."""
    content, content_type = _body(payload, tensors, asked.content_type)
    headers = {"Content-Type": content_type,
               "Idempotency-Key": asked.idempotency_key or new_idempotency_key()}
    if asked.timeout is not None:
        headers["X-Request-Timeout"] = f"{asked.timeout:.15g}"
    if hold_s > 0:
        headers["Prefer"] = f"wait={round(hold_s, 3):g}"
    params = _query(model=asked.model, priority=asked.priority, client_id=asked.client_id,
                    version=None if asked.version is None else str(asked.version))
    return Call("POST", "/v1/inference", params, headers, content, hold_s)


def hold_for(deadline: float | None, now: float, most_s: float = MAX_HOLD_S) -> float:
    """Seconds to ask the gateway to hold a call when the caller waits until ``deadline``
    (monotonic; None: for as long as it takes), at most ``most_s`` (the gateway's
    ``FERRY_MAX_POLL_S``), to the millisecond."""
    if deadline is None:
        return most_s
    return max(0.0, round(min(most_s, deadline - now), 3))


def result(task_id: str, hold_s: float = 0.0) -> Call:
    """``GET /v1/result/{id}``, held up to ``hold_s`` for the task to end."""
    return Call("GET", f"/v1/result/{task_id}",
                _query(wait=f"{round(hold_s, 3):g}" if hold_s > 0 else None), hold_s=hold_s)


_MOST_WAIT = re.compile(r"between 0 and ([0-9.]+) seconds")


def most_wait_s(error: FerryError) -> float | None:
    """The gateway's longest hold, as its ``invalid_wait`` refusal names it (None: another
    error): a gateway whose ``FERRY_MAX_POLL_S`` is under the client's ``max_hold_s``."""
    found = _MOST_WAIT.search(error.message) if error.code == "invalid_wait" else None
    return float(found.group(1)) if found else None


def retried_answer(status: int, call: Call) -> bool:
    """Whether an answer is worth trying again: 429 (refused before anything was done), and
    503 for a call that may be repeated (Ferry or a part of it away for a moment)."""
    return status == 429 or (call.idempotent and retried_status(status))


def retried_error(exc: httpx.TransportError, call: Call) -> bool:
    """Whether a failed try is worth making again: a connection that could not be opened (the
    request never left), or one that broke or timed out, for a call that may be repeated; never
    the client's own mistake (a URL without a scheme, a malformed header)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return True
    return call.idempotent and isinstance(
        exc, httpx.NetworkError | httpx.TimeoutException | httpx.RemoteProtocolError)


def cancel(task_id: str) -> Call:
    """``DELETE /v1/result/{id}`` (a repeat answers the same: safe to retry)."""
    return Call("DELETE", f"/v1/result/{task_id}")


def checked(response: httpx.Response, *ok: int) -> Any:
    """The answer's JSON when its status is one of ``ok``; else its error, raised."""
    if response.status_code in ok:
        return orjson.loads(response.content)
    raise error_of(response)


def error_of(response: httpx.Response) -> FerryError:
    """The exception for an error answer (its body read)."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = None
    return error_from_answer(response.status_code, body,
                             retry_after_s(response.headers.get("retry-after")))


def submitted(response: httpx.Response) -> TaskResult | str:
    """A submission's answer: the final record (200, ``Prefer: wait`` was met), or the task's
    id (202)."""
    doc = checked(response, 200, 202)
    if response.status_code == 200:
        return TaskResult.from_json(doc)
    return str(doc["task_id"])


# Jobs (docs/jobs.md).
def manifest_content(manifest: Manifest) -> bytes | Path:
    """A manifest to upload: a JSONL file's path (streamed from disk on each attempt), or the
    items of an iterable encoded as JSONL (held in memory, so that a retry sends them again)."""
    if isinstance(manifest, str | os.PathLike):
        return Path(manifest)
    return b"".join(orjson.dumps(item) + b"\n" for item in manifest)


@dataclass(frozen=True)
class JobOptions:
    """What a job asks for, beside its manifest (docs/jobs.md#routes)."""

    model: str | None = None
    priority: str | None = None
    completion_window: str | None = None
    timeout_s: float | None = None
    client_id: str | None = None
    idempotency_key: str | None = None


def submit_job(manifest: Manifest, options: JobOptions) -> Call:
    """``POST /v1/jobs`` with an ``Idempotency-Key``: a retried upload gets the first's job."""
    params = _query(model=options.model, priority=options.priority,
                    completion_window=options.completion_window,
                    timeout_s=options.timeout_s, client_id=options.client_id)
    headers = {"Content-Type": NDJSON,
               "Idempotency-Key": options.idempotency_key or new_idempotency_key()}
    return Call("POST", "/v1/jobs", params, headers, manifest_content(manifest))


def job(job_id: str) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}")


def jobs(limit: int | None, before: str | None, client_id: str | None) -> Call:
    return Call("GET", "/v1/jobs", _query(limit=limit, before=before, client_id=client_id))


def cancel_job(job_id: str) -> Call:
    return Call("DELETE", f"/v1/jobs/{job_id}")


def retry_job(job_id: str) -> Call:
    """Not repeated once it may have reached the gateway: a second retry would run the job's
    failed items again (429, a refusal before anything was done, is waited out)."""
    return Call("POST", f"/v1/jobs/{job_id}/retry", idempotent=False)


def final_results(job_id: str, file: str | None) -> Call:
    """An ended job's result lines in line order (``file``: ``output`` or ``errors`` alone)."""
    return Call("GET", f"/v1/jobs/{job_id}/results", _query(file=file))


@dataclass(frozen=True)
class Cursor:
    """Where a reader of a job's results is: ``segments`` is the gateway's cursor (its
    ``Ferry-Next-Cursor``: committed segments read), ``lines`` the lines of the page from there
    already handed out. Written ``"12"`` or ``"12+3"``."""

    segments: int = 0
    lines: int = 0

    def __str__(self) -> str:
        return f"{self.segments}+{self.lines}" if self.lines else str(self.segments)

    @classmethod
    def parse(cls, text: str | Cursor | None) -> Cursor:
        """A cursor from its written form (None: the start)."""
        if text is None or isinstance(text, Cursor):
            return text or cls()
        segments, _, lines = text.partition("+")
        if not (segments.isdigit() and (lines.isdigit() or not lines)):
            raise ValueError(f"{text!r} is not a job results cursor ('12' or '12+3')")
        return cls(int(segments), int(lines or 0))


def results_page(job_id: str, cursor: Cursor) -> Call:
    """The committed results from ``cursor``'s segment on."""
    return Call("GET", f"/v1/jobs/{job_id}/results", _query(after=cursor.segments))


@dataclass(frozen=True)
class Page:
    """One answer of the results route: its lines, the cursor after them and the job's state
    when it was read (a final state: these were the last)."""

    lines: list[ResultLine]
    next_segments: int
    job_status: JobStatus


def page(response: httpx.Response) -> Page:
    """The results route's answer, read."""
    if response.status_code != 200:
        raise error_of(response)
    cursor, status = (response.headers.get("ferry-next-cursor"),
                      response.headers.get("ferry-job-status"))
    if cursor is None or status is None:  # a proxy that strips them: following would repeat
        raise FerryError("the results answer lacks Ferry-Next-Cursor or Ferry-Job-Status (a "
                         "proxy between the client and Ferry dropped them?)",
                         code="missing_headers", status=response.status_code)
    return Page(result_lines(response.content), int(cursor), JobStatus(status))


def ended_results(response: httpx.Response) -> list[ResultLine]:
    """An ended job's results route answer, read; raised for a job still running (its
    answer then holds only what has ended so far, in the order it ended)."""
    if response.status_code != 200:
        raise error_of(response)
    status = response.headers.get("ferry-job-status")
    if status is not None and not JobStatus(status).final:
        raise FerryError(f"the job is {status}: its final results come once it has ended "
                         "(job_results follows it meanwhile)", code="job_not_ended",
                         status=response.status_code)
    return result_lines(response.content)


def result_lines(content: bytes) -> list[ResultLine]:
    """JSONL result lines."""
    return [ResultLine.from_json(orjson.loads(line)) for line in content.splitlines() if line]


@dataclass
class Follower:
    """A reader's place in a job's results while it follows them: each page's lines after the
    ones already handed out, and the cursor after each line handed out."""

    cursor: Cursor

    def take(self, answer: Page) -> Iterator[ResultLine]:
        """The page's lines not handed out yet, the cursor moved past each as it is handed
        out (to the next page's start after the page's last line)."""
        start = self.cursor.lines
        for taken, line in enumerate(answer.lines[start:], start + 1):
            self.cursor = (Cursor(answer.next_segments) if taken >= len(answer.lines)
                           else Cursor(self.cursor.segments, taken))
            yield line
        if start >= len(answer.lines):
            self.cursor = Cursor(answer.next_segments)
