"""``/v1/jobs``: bulk jobs over HTTP (submit a JSONL manifest, follow, cancel, retry, collect).

The work itself is ``ferry.jobs``'; this module turns requests into it and its answers into
JSON, with the error shape of every ``/v1`` route.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import Enum
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ferry import keys
from ferry.access import Access, Caller
from ferry.durations import parse_window
from ferry.errors import (
    BackendError,
    BadRequestError,
    ClientError,
    ConflictError,
    DependencyUnavailableError,
    NotFoundError,
    TooManyRequestsError,
    UnsupportedMediaTypeError,
)
from ferry.gateway.catalog import ModelCatalog
from ferry.gateway.intake import media_type, parse_timeout
from ferry.gateway.query import checked_query
from ferry.jobs.blobs import BlobStore
from ferry.jobs.items import item_request
from ferry.jobs.manifest import Item, Sources
from ferry.jobs.model import JobRecord, JobStatus, moving, sources
from ferry.jobs.results import keyed, segment_lines
from ferry.jobs.run import input_name
from ferry.jobs.store import JobStore, NewJob
from ferry.jobs.upload import Limits, ManifestError, upload
from ferry.priority import Priority
from ferry.settings import GatewaySettings
from ferry.tensors import TensorError
from ferry.webhooks import check_callback

MANIFEST_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/ndjson"})
MAX_LIST = 100
MAX_KEY = 255
CURSOR_HEADER = "Ferry-Next-Cursor"
# The query parameters each route takes (any other is a 400, as in gateway.query); others none.
SUBMIT_QUERY = frozenset({"model", "model_version", "priority", "completion_window",
                          "callback_url", "timeout_s", "client_id"})
LIST_QUERY = frozenset({"limit", "before", "client_id"})
RESULTS_QUERY = frozenset({"after", "file"})
Work = Callable[[Caller], Awaitable[Response]]


def refusal(exc: ClientError) -> JSONResponse:
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if isinstance(exc, ManifestError):
        body["lines"] = [p.to_json() for p in exc.problems]
        body["invalid_lines"] = exc.count
    return JSONResponse({"error": body}, exc.status, headers={
        k.decode("latin-1"): v.decode("latin-1") for k, v in exc.headers()})


class JobsApi:
    """The routes' work: each method answers one route for an authenticated caller."""

    def __init__(self, catalog: ModelCatalog, store: JobStore, blobs: BlobStore,
                 sources: Sources, settings: GatewaySettings) -> None:
        self.catalog = catalog
        self.store = store
        self.blobs = blobs
        self.sources = sources
        self.settings = settings
        self.limits = Limits(settings.job_max_items, settings.job_max_bytes,
                             settings.max_body_bytes)

    async def submit(self, request: Request, caller: Caller) -> Response:
        query = request.query_params
        if media_type(request.headers.get("content-type")) not in MANIFEST_TYPES:
            raise UnsupportedMediaTypeError("unsupported_media_type", "a job's manifest is "
                                            "JSONL: send Content-Type application/x-ndjson or "
                                            "application/jsonl, one item per line")
        client_id = caller.client_for(query.get("client_id", ""))
        idempotency_key = _idempotency_key(request.headers.get("idempotency-key"))
        if idempotency_key:
            replayed = await self._replayed(client_id, idempotency_key)
            if replayed is not None:
                return replayed
        job = await self._new_job(query, client_id)
        pending = await self._within_quota(client_id)
        check = await self._checker(job.model, job.model_version)
        writer = self.blobs.writer(input_name(job.job_id))
        try:
            tally = await upload(request.stream(), writer, self.sources, self.limits, check)
            self._items_within_quota(client_id, pending, tally.lines)
            await writer.commit()
        except BaseException:
            await writer.abort()
            raise
        await self.store.create(dataclasses.replace(job, total=tally.lines),
                                Priority.of(job.priority).label)
        if idempotency_key:
            await self.store.remember(client_id, idempotency_key, job.job_id)
        record = await self.store.read(job.job_id)
        assert record is not None
        return JSONResponse(record.to_json(time.time()), 202,
                            headers={"Location": f"/v1/jobs/{job.job_id}"})

    async def _replayed(self, client_id: str, idempotency_key: str) -> Response | None:
        """The job an earlier submit with the same key created: the answer to a repeat (its
        body is not read); None if there is none."""
        job_id = await self.store.submitted(client_id, idempotency_key)
        record = await self.store.read(job_id) if job_id else None
        if record is None:
            return None
        return JSONResponse(record.to_json(time.time()), 202, headers={
            "Location": f"/v1/jobs/{record.job_id}", "Idempotent-Replayed": "true"})

    async def _new_job(self, query: Any, client_id: str) -> NewJob:
        model = query.get("model") or self.settings.default_model
        priority = Priority.parse(query.get("priority", "batch"), "query.priority")
        max_s = self.settings.job_max_completion_window_s
        window_s = parse_window(query.get("completion_window"),
                                self.settings.job_completion_window_s, max_s)
        callback = query.get("callback_url", "")
        if callback:
            check_callback(callback, self.settings.webhook_hosts)
        version = query.get("model_version", "")
        if version and not (version.isascii() and version.isdigit() and len(version) <= 18):
            raise BadRequestError("invalid_parameter", "query.model_version must be a version "
                                  f"number, not {version[:40]!r}")
        timeout = parse_timeout(query.get("timeout_s"), "query.timeout_s") or 0.0
        return NewJob(keys.new_job_id(), model, 0, client_id, int(priority),
                      time.time() + window_s, version, callback, timeout)

    async def _within_quota(self, client_id: str) -> int:
        """The client's items not finished yet, over its unfinished jobs; a 429 if it has as
        many unfinished jobs as it may."""
        unfinished = await self.store.unfinished(client_id)
        if len(unfinished) >= self.settings.job_max_unfinished:
            raise TooManyRequestsError(
                "too_many_jobs", f"client {client_id or '(anonymous)'!r} has "
                f"{len(unfinished)} unfinished jobs, the limit is "
                f"{self.settings.job_max_unfinished}: wait for one to finish", retry_after_s=10)
        return sum(job.counts.pending for job in unfinished)

    def _items_within_quota(self, client_id: str, pending: int, lines: int) -> None:
        limit = self.settings.job_max_items_per_client
        if limit and pending + lines > limit:
            raise TooManyRequestsError(
                "too_many_items", f"client {client_id or '(anonymous)'!r} has {pending} items "
                f"of unfinished jobs; {lines} more would pass its limit of {limit}: wait for "
                "its jobs to finish", retry_after_s=60)

    async def _checker(self, model: str, version: str) -> Callable[[Item], str]:
        """How each item is checked against the model before anything is queued: tensors
        against its inputs (payloads are checked when fed: an image is decoded then). A model
        that takes neither form refuses the job."""
        catalog = self.catalog
        payload_problem = ""
        try:
            await catalog.resolve(model)
        except ClientError as exc:
            payload_problem = exc.message
        try:
            interface = await catalog.tensor_interface(model, version)
        except ClientError:
            if payload_problem:
                raise
            interface = None

        def check(item: Item) -> str:
            if item.kind != "inputs":
                return f"this item is a payload, but {payload_problem}" if payload_problem \
                    else ""
            if interface is None:
                return f"model {model!r} takes no tensor items"
            try:
                request = item_request(item)
                interface.check(request.inputs, request.output_names, version)
            except (TensorError, ClientError) as exc:
                return str(exc)
            return ""
        return check

    async def status(self, job_id: str, caller: Caller) -> Response:
        record = await self._owned(job_id, caller)
        return JSONResponse(record.to_json(time.time()))

    async def _owned(self, job_id: str, caller: Caller) -> JobRecord:
        record = await self.store.read(job_id) if keys.is_job_id(job_id) else None
        if record is None or (caller.client_id is not None and
                              record.client_id != caller.client_id):
            raise NotFoundError("unknown_job", f"no job {job_id!r}: it never existed, or its "
                                "record expired")
        return record

    async def listing(self, request: Request, caller: Caller) -> Response:
        query = request.query_params
        try:
            limit = int(query.get("limit", "20"))
            before = float(query["before"]) if "before" in query else None
        except ValueError:
            raise BadRequestError("invalid_parameter", "query.limit is a whole number and "
                                  "query.before a creation time (Unix seconds)") from None
        if not 1 <= limit <= MAX_LIST:
            raise BadRequestError("invalid_parameter", f"query.limit must be 1 to {MAX_LIST}")
        client_id = caller.client_id if caller.client_id is not None else \
            query.get("client_id", "")
        found = await self.store.listed(client_id, limit + 1, before)
        now = time.time()
        page = found[:limit]
        doc: dict[str, Any] = {"object": "list", "data": [r.to_json(now) for r in page],
                               "has_more": len(found) > limit}
        if doc["has_more"]:
            doc["next_before"] = page[-1].created_at
        return JSONResponse(doc)

    async def cancel(self, job_id: str, caller: Caller) -> Response:
        await self._owned(job_id, caller)
        before = await self.store.move(job_id, sources(JobStatus.CANCELLING),
                                       JobStatus.CANCELLING)
        if (before is not None and before.final) or before is JobStatus.FINALIZING:
            raise ConflictError("already_finished", f"job {job_id} has already ended "
                                f"({before}); nothing to cancel")
        record = await self._owned(job_id, caller)
        return JSONResponse(record.to_json(time.time()), 202)

    async def retry(self, job_id: str, caller: Caller) -> Response:
        record = await self._owned(job_id, caller)
        if not record.status.final or not record.counts.failed:
            raise ConflictError("nothing_to_retry", f"job {job_id} is {record.status} with "
                                f"{record.counts.failed} failed items: a retry re-runs the "
                                "failed items of a finished job")
        await self.store.activate(job_id)
        before = await self.store.move(job_id, moving(record.status, JobStatus.QUEUED),
                                       JobStatus.QUEUED, retry=1,
                                       attempts=record.attempts + 1, reason="")
        if before is not record.status:
            raise ConflictError("job_changed", f"job {job_id} changed while retrying; look "
                                "again")
        record = await self._owned(job_id, caller)
        return JSONResponse(record.to_json(time.time()), 202)

    async def results(self, request: Request, job_id: str, caller: Caller) -> Response:
        """JSONL result lines: committed segments from ``after`` (a cursor: segments read)
        while the job runs; once it has ended, its output and error files merged in line
        order (or one of them, with ``file``)."""
        record = await self._owned(job_id, caller)
        query = request.query_params
        wanted = query.get("file")
        if wanted not in (None, "output", "errors"):
            raise BadRequestError("invalid_parameter", "query.file is 'output' or 'errors'")
        headers = {"Ferry-Job-Status": record.status.value}
        if record.status.final and "after" not in query:
            names = [record.files[f] for f in (("output", "errors") if wanted is None
                                               else (wanted,)) if f in record.files]
            return StreamingResponse(_in_line_order(self.blobs, names),
                                     media_type="application/x-ndjson", headers=headers)
        after = _cursor(query.get("after"))
        segments = await self.store.segments(job_id, after)
        headers[CURSOR_HEADER] = str(after + len(segments))
        return StreamingResponse(_all_lines(self.blobs, segments),
                                 media_type="application/x-ndjson", headers=headers)


def _idempotency_key(raw: str | None) -> str:
    if raw is None:
        return ""
    if not (0 < len(raw) <= MAX_KEY and raw.isascii() and raw.isprintable()):
        raise BadRequestError("invalid_idempotency_key", f"Idempotency-Key must be 1 to "
                              f"{MAX_KEY} printable ASCII characters")
    return raw


def _cursor(raw: str | None) -> int:
    if raw is None:
        return 0
    if not (raw.isascii() and raw.isdigit() and len(raw) < 10):
        raise BadRequestError("invalid_parameter", "query.after is the cursor a previous "
                              f"answer's {CURSOR_HEADER} header gave, not {raw[:40]!r}")
    return int(raw)


async def _all_lines(blobs: BlobStore, names: list[str]) -> AsyncIterator[bytes]:
    for name in names:
        async for line in segment_lines(blobs, name):
            yield line + b"\n"


async def _in_line_order(blobs: BlobStore, names: list[str]) -> AsyncIterator[bytes]:
    parts = [await keyed(blobs, name, order) for order, name in enumerate(names)]
    for _, _, line in heapq.merge(*parts):
        yield line + b"\n"


async def _guarded(access: Access, request: Request, work: Work,
                   accepted: frozenset[str] = frozenset()) -> Response:
    """``work``'s answer for the authenticated caller, or the error's, as ``/v1`` writes it; a
    query parameter not in ``accepted``, or one given twice, is refused before any work."""
    try:
        caller = await access.check(request.headers.get("authorization"),
                                    request.headers.get("x-api-key"))
        checked_query(request.query_params.multi_items(), accepted, _route(request))
        answer = await work(caller)
    except ClientError as exc:
        return refusal(exc)
    except BackendError as exc:
        return JSONResponse({"error": {"code": "backend_error", "message": exc.reason}}, 502)
    except DependencyUnavailableError as exc:
        return JSONResponse({"error": {"code": "unavailable", "message": "a dependency is "
                                       f"unavailable: {exc}"}}, 503, headers={"Retry-After": "1"})
    for name, value in caller.headers:
        answer.headers[name.decode("latin-1")] = value.decode("latin-1")
    return answer


def _route(request: Request) -> str:
    """``"GET /v1/jobs/{job_id}"``: the request's route, as a refusal names it."""
    return f"{request.method} {getattr(request.scope.get('route'), 'path', request.url.path)}"


ERRORS = {400: "a query parameter is unknown, repeated or invalid, or the manifest is "
          "invalid (lines listed)",
          401: "FERRY_AUTH is on and the credential is missing or not accepted",
          404: "unknown job (or another client's), or unknown model",
          409: "the job is in a state that does not allow it",
          413: "the manifest is over job_max_bytes or job_max_items",
          415: "the manifest is not sent as application/x-ndjson",
          429: "too many unfinished jobs, or the client's rate",
          500: "a bug in the gateway (logged)", 503: "Redis unavailable; retry later"}
ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
NDJSON_CONTENT = {"application/x-ndjson": {"schema": {"type": "string", "format": "binary"}}}


def _documented(ok: int, codes: tuple[int, ...], ok_text: str, ndjson: bool = False
                ) -> dict[int | str, dict[str, Any]]:
    answers: dict[int | str, dict[str, Any]] = {
        code: {"description": ERRORS[code], "content": ERROR_CONTENT}
        for code in (*codes, 401, 500, 503)}
    answers[ok] = ({"description": ok_text, "content": NDJSON_CONTENT} if ndjson
                   else {"description": ok_text})
    return answers


MANIFEST_BODY = {"requestBody": {"required": True, "content": NDJSON_CONTENT,
                                 "description": "one item per line: {custom_id, input | "
                                 "input_base64 | inputs | uri}"}}


def add_job_routes(api: FastAPI, jobs: JobsApi, access: Access) -> None:
    tags: list[str | Enum] = ["Bulk jobs"]

    @api.post("/v1/jobs", tags=tags, status_code=202, summary="Submit a job: a JSONL manifest "
              "of items (query: model, model_version, priority, completion_window, "
              "callback_url, timeout_s)", openapi_extra=MANIFEST_BODY,
              responses=_documented(202, (400, 404, 413, 415, 429), "the job, queued"))
    async def submit(request: Request) -> Response:
        return await _guarded(access, request, lambda c: jobs.submit(request, c), SUBMIT_QUERY)

    @api.get("/v1/jobs", tags=tags, summary="A client's jobs, newest first (limit, before)",
             responses=_documented(200, (400,), "a page of jobs"))
    async def listing(request: Request) -> Response:
        return await _guarded(access, request, lambda c: jobs.listing(request, c), LIST_QUERY)

    @api.get("/v1/jobs/{job_id}", tags=tags, summary="A job's state, counts and progress",
             responses=_documented(200, (400, 404), "the job"))
    async def status(request: Request, job_id: str) -> Response:
        return await _guarded(access, request, lambda c: jobs.status(job_id, c))

    @api.delete("/v1/jobs/{job_id}", tags=tags, status_code=202, summary="Cancel a job",
                responses=_documented(202, (400, 404, 409), "the job, cancelling"))
    async def cancel(request: Request, job_id: str) -> Response:
        return await _guarded(access, request, lambda c: jobs.cancel(job_id, c))

    @api.post("/v1/jobs/{job_id}/retry", tags=tags, status_code=202,
              summary="Re-run the failed items of a finished job",
              responses=_documented(202, (400, 404, 409), "the job, queued again"))
    async def retry(request: Request, job_id: str) -> Response:
        return await _guarded(access, request, lambda c: jobs.retry(job_id, c))

    @api.get("/v1/jobs/{job_id}/results", tags=tags, summary="Result lines, JSONL (after: "
             "a cursor, while the job runs; file: output or errors, once it has ended)",
             responses=_documented(200, (400, 404), "result lines", ndjson=True))
    async def results(request: Request, job_id: str) -> Response:
        return await _guarded(access, request, lambda c: jobs.results(request, job_id, c),
                              RESULTS_QUERY)
