"""``AsyncClient``: Ferry's ``/v1`` API from asyncio code, the twin of ``Client``: the same
methods, awaited, sending the same calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType

import httpx

from ferry.client import calls
from ferry.client.calls import CHUNK, Call, Cursor, Follower, Inference, JobOptions, Manifest
from ferry.client.errors import ConnectionFailedError, FerryError, ResultTimeoutError
from ferry.client.records import JobList, JobRecord, ResultLine, TaskResult
from ferry.client.retrying import Attempts, RetryPolicy, retry_after_s


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    """A manifest file, read in a thread a chunk at a time (a slow disk or NFS never stalls
    the event loop, and the held calls on it)."""
    handle = await asyncio.to_thread(path.open, "rb")
    try:
        while chunk := await asyncio.to_thread(handle.read, CHUNK):
            yield chunk
    finally:
        await asyncio.to_thread(handle.close)


class AsyncClient:
    """Ferry's ``/v1`` API: inference, tasks and bulk jobs, retried as ``retry`` says
    (connection errors, 429 and 503; a submission's every try carries the same
    ``Idempotency-Key``, so a retry never runs a task twice).

    ``url``: the gateway; ``api_key``: sent as a bearer token; ``timeout_s``: connect, write
    and read timeouts of one request (a held one's read timeout grows by its hold);
    ``max_hold_s``: the longest the gateway holds a call (its ``FERRY_MAX_POLL_S``; a lower
    one is learned from its first refusal); ``transport``: httpx's (tests, proxies)."""

    def __init__(self, url: str = calls.DEFAULT_URL, *, api_key: str | None = None,
                 retry: RetryPolicy | None = None, timeout_s: float = 30.0,
                 max_hold_s: float = calls.MAX_HOLD_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        self.max_hold_s = max_hold_s
        self.http = httpx.AsyncClient(base_url=url, headers=calls.auth_headers(api_key),
                                 transport=transport, timeout=timeout_s)

    async def close(self) -> None:
        """Close its connections."""
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        await self.close()

    async def send(self, call: Call) -> httpx.Response:
        """``call``'s answer, tried again (the same request) while it fails in a way worth
        retrying and the policy allows; the last answer otherwise (an error answer is the
        caller's to raise)."""
        attempts = Attempts(self.retry)
        while True:
            try:
                response = await self.http.request(
                    call.method, call.path, params=call.params, headers=call.headers,
                    content=_chunks(call.content) if isinstance(call.content, Path)
                    else call.content, timeout=self._timeout(call))
            except httpx.TransportError as exc:
                if not calls.retried_error(exc, call) or (delay := attempts.next_delay()) is None:
                    raise ConnectionFailedError(f"{call.method} {call.path}: {exc!r}") from exc
            else:
                if not calls.retried_answer(response.status_code, call) or (
                        delay := attempts.next_delay(
                            retry_after_s(response.headers.get("retry-after")))) is None:
                    return response
            await asyncio.sleep(delay)

    def _timeout(self, call: Call) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_s, read=self.timeout_s + call.hold_s)

    # Tasks.
    async def infer(self, model: str | None, payload: calls.Payload | None = None, *,  # noqa: PLR0913 - the API's per-call options
              tensors: calls.Tensors | None = None, priority: str | None = None,
              timeout: float | None = None, version: str | int | None = None,
              idempotency_key: str | None = None, client_id: str | None = None,
              content_type: str | None = None, wait: float | None = None) -> TaskResult:
        """Run one inference and answer its final record (SUCCESS, FAILED, EXPIRED or
        CANCELLED: check ``.ok``). ``payload``: bytes (sent as ``content_type``, default
        ``application/octet-stream``) or text; or ``tensors``: the tensor form's ``inputs``.
        ``timeout``: the task's deadline (seconds); ``wait``: the most seconds to wait for it
        (None: until it ends), past which ``ResultTimeoutError`` is raised. The call is held
        with ``Prefer: wait``, then ``GET ?wait=`` until the task ends."""
        asked = Inference(model, priority, timeout, version, client_id,
                          idempotency_key, content_type)
        deadline = None if wait is None else time.monotonic() + wait
        call = calls.inference(payload, tensors, asked,
                               calls.hold_for(deadline, time.monotonic(), self.max_hold_s))
        answer = calls.submitted(await self.send(call))
        if isinstance(answer, TaskResult) and answer.final:
            return answer
        task_id = answer.task_id if isinstance(answer, TaskResult) else answer
        return await self._final(task_id, deadline, wait)

    async def submit(self, model: str | None, payload: calls.Payload | None = None, *,
               tensors: calls.Tensors | None = None, priority: str | None = None,
               timeout: float | None = None, version: str | int | None = None,
               idempotency_key: str | None = None, client_id: str | None = None,
               content_type: str | None = None) -> AsyncTask:
        """Submit one inference without waiting for it: its ``Task`` (as ``infer`` for the
        arguments)."""
        asked = Inference(model, priority, timeout, version, client_id,
                          idempotency_key, content_type)
        answer = calls.submitted(await self.send(calls.inference(payload, tensors, asked)))
        return AsyncTask(self, answer.task_id if isinstance(answer, TaskResult) else answer)

    async def result(self, task_id: str, wait: float | None = None) -> TaskResult:
        """The task's final record, waiting at most ``wait`` seconds (None: until it ends)
        for it; ``ResultTimeoutError`` when it has not ended by then."""
        deadline = None if wait is None else time.monotonic() + wait
        return await self._final(task_id, deadline, wait)

    async def _final(self, task_id: str, deadline: float | None, wait: float | None) -> TaskResult:
        while True:
            hold = calls.hold_for(deadline, time.monotonic(), self.max_hold_s)
            try:
                record = TaskResult.from_json(calls.checked(
                    await self.send(calls.result(task_id, hold)), 200))
            except FerryError as error:
                most = calls.most_wait_s(error)
                if most is None or most >= self.max_hold_s:
                    raise
                self.max_hold_s = most  # the gateway holds less long than 30 s: ask less
                continue
            if record.final:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeoutError(task_id, wait or 0.0)

    async def status(self, task_id: str) -> TaskResult:
        """The task's record now (PENDING, or final)."""
        return TaskResult.from_json(calls.checked(await self.send(calls.result(task_id)), 200))

    async def cancel(self, task_id: str) -> TaskResult:
        """Cancel the task: its record, now CANCELLED (``AlreadyFinishedError`` or
        ``AlreadyRunningError`` when too late)."""
        return TaskResult.from_json(calls.checked(await self.send(calls.cancel(task_id)), 200))

    # Jobs.
    async def submit_job(self, manifest: Manifest, *, model: str | None = None,
                   priority: str | None = None, completion_window: str | None = None,
                   timeout_s: float | None = None, client_id: str | None = None,
                   idempotency_key: str | None = None) -> JobRecord:
        """Submit a job: ``manifest`` is a JSONL file's path, or an iterable of items
        (``{"custom_id", "input" | "input_base64" | "uri" | "inputs"}``). A retried upload
        carries the same ``Idempotency-Key``, so it never makes a second job."""
        options = JobOptions(model, priority, completion_window, timeout_s, client_id,
                             idempotency_key)
        return await self._job(calls.submit_job(manifest, options), 202)

    async def job(self, job_id: str) -> JobRecord:
        """The job's record now."""
        return await self._job(calls.job(job_id), 200)

    async def jobs(self, limit: int | None = None, before: str | None = None,
             client_id: str | None = None) -> JobList:
        """A page of the client's jobs, newest first."""
        return JobList.from_json(calls.checked(
            await self.send(calls.jobs(limit, before, client_id)), 200))

    async def cancel_job(self, job_id: str) -> JobRecord:
        """Cancel the job: its record, now ``cancelling``."""
        return await self._job(calls.cancel_job(job_id), 202)

    async def retry_job(self, job_id: str) -> JobRecord:
        """Run an ended job's failed items again."""
        return await self._job(calls.retry_job(job_id), 202)

    async def _job(self, call: Call, ok: int) -> JobRecord:
        return JobRecord.from_json(calls.checked(await self.send(call), ok))

    async def wait_job(self, job_id: str, *, on_progress: Callable[[JobRecord], None] | None = None,
                 poll_s: float = 1.0) -> JobRecord:
        """Follow the job until it ends (``on_progress`` sees each record read): its last
        record."""
        while True:
            record = await self.job(job_id)
            if on_progress is not None:
                on_progress(record)
            if record.final:
                return record
            await asyncio.sleep(poll_s)

    def job_results(self, job_id: str, *, after: str | Cursor | None = None,
                    follow: bool = True, poll_s: float = 0.5) -> AsyncJobResults:
        """The job's result lines in the order they were committed, from ``after`` (a
        ``cursor`` a previous iterator exposed; None: the start); with ``follow``, until the
        job ends (an item retried appears again, with its new result)."""
        return AsyncJobResults(self, job_id, Cursor.parse(after), follow, poll_s)

    async def final_results(self, job_id: str, file: str | None = None) -> list[ResultLine]:
        """An ended job's result lines, each item once, in line order (``file``: ``output``
        or ``errors`` alone)."""
        return calls.ended_results(await self.send(calls.final_results(job_id, file)))


class AsyncTask:
    """A submitted task: ask for its result, its status, or cancel it."""

    def __init__(self, client: AsyncClient, task_id: str) -> None:
        self.client = client
        self.task_id = task_id

    async def result(self, wait: float | None = None) -> TaskResult:
        """Its final record (see ``Client.result``)."""
        return await self.client.result(self.task_id, wait)

    async def status(self) -> TaskResult:
        """Its record now."""
        return await self.client.status(self.task_id)

    async def cancel(self) -> TaskResult:
        """Cancel it (see ``Client.cancel``)."""
        return await self.client.cancel(self.task_id)

    def __repr__(self) -> str:
        return f"AsyncTask({self.task_id!r})"


class AsyncJobResults:
    """An iterator of a job's result lines; ``cursor`` says where it is (after the last line
    it handed out): give it as ``after`` to a new iterator to go on from there."""

    def __init__(self, client: AsyncClient, job_id: str, cursor: Cursor, follow: bool,
                 poll_s: float) -> None:
        self.client = client
        self.job_id = job_id
        self.follower = Follower(cursor)
        self._lines = self._read(follow, poll_s)

    @property
    def cursor(self) -> str:
        """Where to resume: after the last line handed out."""
        return str(self.follower.cursor)

    def __aiter__(self) -> AsyncJobResults:
        return self

    async def __anext__(self) -> ResultLine:
        return await anext(self._lines)

    async def _read(self, follow: bool, poll_s: float) -> AsyncIterator[ResultLine]:
        while True:
            answer = calls.page(await self.client.send(
                calls.results_page(self.job_id, self.follower.cursor)))
            for line in self.follower.take(answer):
                yield line
            if answer.job_status.final or not follow:
                return
            if not answer.lines:
                await asyncio.sleep(poll_s)

