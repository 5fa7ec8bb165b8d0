"""The gateway application: the hot lane in front, FastAPI behind it (docs, health, metrics)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferry import __version__
from ferry.compose.gateway import GatewayParts, gateway_parts
from ferry.errors import DependencyUnavailableError, clip_echoes
from ferry.gateway.admin import AdminToken, RolloutAdmin, add_admin_routes
from ferry.gateway.assembly import GatewayRoom, assemble
from ferry.gateway.bulk.parts import job_parts
from ferry.gateway.bulk.routes import add_job_routes
from ferry.gateway.grpc_server import GrpcPort
from ferry.gateway.hot import HotLane, went_away
from ferry.gateway.schemas import add_hot_route_docs
from ferry.gateway.service import Gateway
from ferry.gateway.timeouts import STATE_KEY, ReadTimeouts
from ferry.oip.grpc_service import InferenceService
from ferry.oip.infer import Inference, add_infer_routes
from ferry.oip.rest import PREFIX as OIP_PREFIX
from ferry.oip.rest import Discovery, oip_error, oip_router, tidy_openapi
from ferry.oip.served import ServedStatistics
from ferry.redis_conn import unavailable
from ferry.settings import GatewaySettings, load
from ferry.telemetry.metrics import GatewayMetrics
from ferry.triton.base import InferenceBackend
from ferry.usage.store import LedgerReader

DESCRIPTION = "Batches inference requests that arrive one at a time for Triton."
SWAGGER_UI = Path(__file__).parent / "static" / "swagger-ui"
DOCS_ASSETS = "/docs/assets"
API_OPTIONS: dict[str, Any] = {"title": "Ferry", "version": __version__, "description": DESCRIPTION,
                               "docs_url": None, "redoc_url": None}  # _add_docs serves /docs


def error_response(status: int, code: str, message: str,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": clip_echoes(message)}}, status,
                        headers=headers)


def create_app(settings: GatewaySettings, backend: InferenceBackend | None = None, *,
               parts: GatewayParts | None = None) -> HotLane:
    """The gateway app; connections open in its lifespan, never at import."""
    room = assemble(parts or gateway_parts(settings, backend=backend))
    gateway, metrics, access = Gateway(room), room.parts.metrics, room.parts.access
    discovery = discovery_of(room, gateway)
    inference = Inference(gateway, room.catalog.interface, settings.max_body_bytes,
                          room.parts.tracing)
    grpc_port = (GrpcPort(settings, InferenceService(discovery, inference, metrics))
                 if settings.grpc_port else None)
    jobs = job_parts(room, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Any]]:
        await gateway.start()
        try:
            if grpc_port is not None:
                await grpc_port.start()
            if settings.jobs:
                await jobs.runner.start()
            yield {STATE_KEY: read_timeouts(settings, metrics)}  # for each connection
        finally:
            await jobs.runner.stop()
            if grpc_port is not None:
                await grpc_port.stop()
            await gateway.stop()

    api = FastAPI(lifespan=lifespan, **API_OPTIONS)
    _install_error_handlers(api)
    _add_routes(api, gateway, room.parts)
    oip = oip_router(discovery)
    add_infer_routes(oip, inference, access)
    add_job_routes(api, jobs.api, access)
    add_admin_routes(api, RolloutAdmin(room.rollouts, room.versions, room.catalog),
                     AdminToken(settings.admin_token),
                     LedgerReader(room.parts.hot, settings.partitions))
    api.include_router(oip)
    api.openapi = lambda: _openapi(api)  # type: ignore[method-assign]
    api.add_middleware(MetricsMiddleware, metrics=metrics)
    return HotLane(gateway, room.parts, api)


def discovery_of(room: GatewayRoom, gateway: Gateway) -> Discovery:
    """What the protocol's discovery answers come from: Triton, through the gateway's backend
    and catalog, and Ferry's own statistics."""
    backend, metadata = room.parts.backend, room.catalog.metadata
    return Discovery(backend, metadata, gateway.serving, room.parts.access,
                     ServedStatistics(backend, room.parts.hot, metadata))


def app_from_environment() -> HotLane:
    """For ``uvicorn --factory`` workers: settings from the ``FERRY_*`` variables."""
    return create_app(load(GatewaySettings))


def read_timeouts(settings: GatewaySettings, metrics: GatewayMetrics) -> ReadTimeouts:
    """The connections' read timeouts, those no route sees counted as refusals."""
    def count(kind: str) -> None:
        metrics.rejected.labels("408", kind).inc()

    return ReadTimeouts(settings.header_timeout_s, settings.body_timeout_s, count)


def _add_docs(api: FastAPI) -> None:
    """``/docs``: Swagger UI, its script and style served from the package's own files
    (``static/swagger-ui``), never a CDN, so that the page works with no internet. No ReDoc:
    one page of docs, one vendored bundle."""
    api.mount(DOCS_ASSETS, StaticFiles(directory=SWAGGER_UI), name="docs-assets")

    @api.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=api.openapi_url or "/openapi.json", title=f"{api.title} API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")


def _openapi(api: FastAPI) -> dict[str, Any]:
    if api.openapi_schema is None:
        document = get_openapi(title=api.title, version=api.version,
                               description=api.description, routes=api.routes)
        api.openapi_schema = tidy_openapi(add_hot_route_docs(document))
    return api.openapi_schema


def _add_routes(api: FastAPI, gateway: Gateway, parts: GatewayParts) -> None:
    metrics, capacity = parts.metrics, parts.capacity

    @api.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/readyz", summary="Redis and Triton reachable, default model ready")
    async def readyz() -> JSONResponse:
        ready, checks = await gateway.readiness()
        return JSONResponse({"ready": ready, "checks": checks,
                             "circuits": await capacity.circuits()}, 200 if ready else 503)

    @api.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    async def exposition() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    _add_docs(api)


def _install_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if _is_oip(request):  # only path parameters: a path Triton would not route
            return oip_error(404, "Not Found")
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        return error_response(400, "invalid_parameter", problems)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if _is_oip(request):
            return oip_error(exc.status_code, str(exc.detail), [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in (exc.headers or {}).items()])
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of every route on the path, not one route's
            headers["Allow"] = _allowed(api, request) or headers.get("Allow", "")
        return error_response(exc.status_code, code, str(exc.detail), headers)

    async def refused(_: Request, exc: Exception) -> JSONResponse:
        return error_response(503, *unavailable(exc), {"Retry-After": "1"})

    @api.exception_handler(ClientDisconnect)
    async def gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        """A body that never came whole; nobody reads this answer (the connection is closed),
        but the metrics count it, as the hot routes count theirs."""
        error = went_away(request.scope)
        return error_response(error.status, error.code, error.message)

    api.add_exception_handler(DependencyUnavailableError, refused)


def _allowed(api: FastAPI, request: Request) -> str:
    """The methods the routes on the request's path take, as an ``Allow`` header."""
    methods: set[str] = set()
    for route in api.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET", "type": "http"})
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def _is_oip(request: Request) -> bool:
    """Whether the path is the Open Inference Protocol's, whose errors are Triton's."""
    path = request.url.path
    return path == OIP_PREFIX or path.startswith(f"{OIP_PREFIX}/")


class MetricsMiddleware:
    """Counts and times the routes FastAPI serves, by route template (plain ASGI)."""

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
            self.metrics.observe_request(path, scope["method"], status,
                                         time.perf_counter() - started)
