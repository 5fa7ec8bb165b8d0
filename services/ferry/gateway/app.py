"""The FastAPI application: routes stay thin, the work is in intake, catalog, queue and results."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferry import __version__, keys
from ferry.errors import BackendError, BadRequestError, DependencyUnavailableError
from ferry.gateway.catalog import ModelCatalog
from ferry.gateway.intake import check_payload, media_type, parse_submission, read_body
from ferry.gateway.schemas import ERRORS, RAW_BODY_DOC, Accepted, TaskResult
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import connect
from ferry.results.base import ResultRecord, Status
from ferry.results.redis_store import RedisResultStore
from ferry.settings import GatewaySettings
from ferry.telemetry.metrics import GatewayMetrics
from ferry.triton.base import InferenceBackend
from ferry.triton.grpc_backend import TritonGrpcBackend
from ferry.v1.task_pb2 import Task


def error_response(status: int, code: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


class Gateway:
    """The gateway's connections and the operations its routes call."""

    def __init__(self, settings: GatewaySettings, backend: InferenceBackend | None = None) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.backend: InferenceBackend = backend or TritonGrpcBackend(settings.triton_grpc_target)
        self.catalog = ModelCatalog(self.backend, settings.catalog_refresh_s)
        self.redis = connect(settings)
        self.queue = RedisStreamQueue(self.redis, partitions=settings.partitions,
                                      pending_ttl_s=settings.pending_ttl_s)
        self.results = RedisResultStore(self.redis, settings.result_ttl_s)

    async def start(self) -> None:
        await self.backend.start()
        await self.results.start_listener()

    async def stop(self) -> None:
        await self.results.stop_listener()
        await self.backend.close()
        await self.redis.aclose()

    async def submit(self, request: Request, model_param: str | None) -> Accepted:
        body = await read_body(request.stream(), request.headers.get("content-length"),
                               self.settings.max_body_bytes)
        submission = parse_submission(body, media_type(request.headers.get("content-type")),
                                      model_param)
        spec = await self.catalog.resolve(submission.model or self.settings.default_model)
        if spec.input_kind == "image":
            await asyncio.to_thread(check_payload, spec.input_kind, submission.payload)
        else:
            check_payload(spec.input_kind, submission.payload)
        task_id = keys.new_task_id()
        now = time.time()
        task = Task(task_id=task_id, model=spec.name, payload=submission.payload,
                    content_type=submission.content_type, enqueued_at_ms=int(now * 1000),
                    client_id=submission.client_id)
        pending = ResultRecord(task_id=task_id, status=Status.PENDING, model=spec.name,
                               created_at=now)
        await self.queue.enqueue(task, pending)
        self.metrics.accepted.labels(spec.name).inc()
        return Accepted(task_id=task_id, status_url=f"/v1/result/{task_id}")

    async def result(self, task_id: str, wait: float) -> ResultRecord:
        if not 0 <= wait <= self.settings.max_poll_s:
            raise BadRequestError("invalid_wait", f"'wait' must be between 0 and "
                                  f"{self.settings.max_poll_s:g} seconds, got {wait:g}")
        record = None
        if keys.is_task_id(task_id):
            if wait > 0:
                record = await self.results.wait(task_id, wait)
            else:
                record = await self.results.get(task_id)
        if record is None:
            raise BadRequestError("unknown_task", f"no task {task_id!r}: it never existed, or its "
                                  f"result expired ({self.settings.result_ttl_s} s after "
                                  "it finished)", 404)
        return record

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        checks: dict[str, str] = {}
        try:
            await self.redis.ping()
            checks["redis"] = "ok"
        except (RedisError, OSError) as exc:
            checks["redis"] = f"unreachable: {exc}"
        checks["triton"] = "ok" if await self.backend.server_ready() else "not ready"
        try:
            models = await self.backend.ready_models()
            ok = self.settings.default_model in models
            checks["default_model"] = "ok" if ok else f"{self.settings.default_model!r} not ready"
        except BackendError as exc:
            checks["default_model"] = f"unknown: {exc}"
        return all(v == "ok" for v in checks.values()), checks


def create_app(settings: GatewaySettings, backend: InferenceBackend | None = None) -> FastAPI:
    """The gateway app; connections open in its lifespan, never at import."""
    gateway = Gateway(settings, backend)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="Ferry", version=__version__, lifespan=lifespan,
                  description="Batches inference requests that arrive one at a time for Triton.")
    app.state.gateway = gateway
    _install_error_handlers(app)
    app.add_middleware(MetricsMiddleware, metrics=gateway.metrics)
    _add_routes(app, gateway)
    return app


def _add_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.post("/v1/inference", status_code=202, response_model=Accepted, responses=ERRORS,
              openapi_extra=RAW_BODY_DOC, summary="Submit one request; returns a task id at once")
    async def submit(request: Request, response: Response,
                     model: str | None = Query(None, description="model, for raw bodies")
                     ) -> Accepted:
        accepted = await gateway.submit(request, model)
        response.headers["Location"] = accepted.status_url
        return accepted

    @app.get("/v1/result/{task_id}", response_model=TaskResult, response_model_exclude_none=True,
             responses=ERRORS, summary="A task's status and result; ?wait= long-polls")
    async def result(task_id: str,
                     wait: float = Query(0.0, description="seconds to wait for a final status")
                     ) -> JSONResponse:
        # A Response skips re-validation against TaskResult (documentation only): the record
        # already has that shape, and this route carries every long-poll.
        return JSONResponse((await gateway.result(task_id, wait)).to_json())

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Redis and Triton reachable, default model ready")
    async def readyz() -> JSONResponse:
        ready, checks = await gateway.readiness()
        return JSONResponse({"ready": ready, "checks": checks}, 200 if ready else 503)

    @app.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(BadRequestError)
    async def bad_request(request: Request, exc: BadRequestError) -> JSONResponse:
        request.app.state.gateway.metrics.rejected.labels(exc.code).inc()
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        return error_response(400, "invalid_parameter", problems)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        return error_response(503, "unavailable", f"a dependency is unavailable: {exc}",
                              {"Retry-After": "1"})

    for kind in (DependencyUnavailableError, RedisError, ConnectionError):
        app.add_exception_handler(kind, unavailable)


class MetricsMiddleware:
    """Counts and times requests by route template (a plain ASGI middleware: no body copying)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"]
            self.metrics.requests.labels(path, method, str(status)).inc()
            self.metrics.latency.labels(path, method).observe(time.perf_counter() - started)
