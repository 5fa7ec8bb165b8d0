"""The Open Inference Protocol's REST discovery routes, as Triton serves them, under ``/v2``.

``tritonclient.http`` pointed at the gateway gets the answers Triton would give: health, server
metadata (Ferry's own: its name, version and only the extensions it supports), each model's
metadata, readiness and configuration, which come from Triton in its own JSON shapes, and its
statistics: Ferry's own work (the requests it served, its queue, its calls to Triton) in Triton's
shape (``ferry.oip.statistics``). Errors are Triton's: its status codes and a
``{"error": "..."}`` body with its words. With ``FERRY_AUTH`` on, every route but health needs
the credential ``/v1`` takes. These routes are FastAPI's: none of them is on the hot path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi import Path as FastApiPath
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ferry import SERVER_NAME, __version__
from ferry.access import Access, Caller
from ferry.errors import BackendError, ClientError, DependencyUnavailableError, clip_echoes
from ferry.triton.base import ModelDiscovery

PREFIX = "/v2"
# What Ferry serves of Triton's extensions. Not shared memory (a remote front end cannot map a
# client's memory), nor sequences (a stateful model needs one instance per sequence, which a
# queue in front cannot promise), nor classification.
EXTENSIONS = ("model_configuration", "statistics", "binary_tensor_data")
NOT_READY = "Model version not ready"
# Triton's HTTP status for each of its error codes (as gRPC names them); others are a 400.
_STATUS = {"NOT_FOUND": 404, "INTERNAL": 500, "UNAVAILABLE": 503, "UNIMPLEMENTED": 501}

Work = Callable[[], Awaitable[Response]]
CallerWork = Callable[[Caller], Awaitable[Response]]


class OipError(BaseModel):
    """Every error of the ``/v2`` routes, as Triton writes it."""

    error: str


class ServerMetadata(BaseModel):
    name: str = Field(description="'ferry'")
    version: str
    extensions: list[str] = Field(description="the protocol extensions Ferry supports")


class TensorMetadata(BaseModel):
    name: str
    datatype: str = Field(description="BOOL, UINT8...UINT64, INT8...INT64, FP16, BF16, FP32, "
                          "FP64 or BYTES")
    shape: list[int] = Field(description="-1: any size (the batch dimension, for one)")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(default_factory=list)
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelStatistics(BaseModel):
    model_stats: list[dict[str, Any]] = Field(
        description="per version, in Triton's shape: the requests Ferry served, its queue and "
                    "its calls to Triton (docs/oip.md)")


@dataclass(frozen=True)
class Discovery:
    """Where the answers come from: Triton (through the gateway's backend), the model metadata
    through the gateway's short cache, the gateway's readiness, its access rules, and the
    statistics of Ferry's own work in Triton's shape (``ferry.oip.served``)."""

    backend: ModelDiscovery
    metadata: Callable[[str, str], Awaitable[dict[str, Any]]]
    serving: Callable[[], Awaitable[bool]]
    access: Access
    statistics: Callable[[str, str], Awaitable[dict[str, Any]]]


def oip_error(status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
              ) -> JSONResponse:
    """An error as Triton answers it."""
    answer = JSONResponse({"error": clip_echoes(message)}, status)  # Triton's words quote names
    for name, value in headers or []:
        answer.headers[name.decode("latin-1")] = value.decode("latin-1")
    return answer


def status_of(error: BackendError) -> int:
    """The HTTP status Triton gives its own refusal; 503 when Triton could not be asked."""
    return _STATUS.get(error.code, 503 if error.transient or not error.code else 400)


async def guarded(access: Access, request: Request, work: Work) -> Response:
    """``work``'s answer for an authenticated caller, or the error's, as Triton writes it."""
    return await guarded_as(access, request, lambda _: work())


async def guarded_as(access: Access, request: Request, work: CallerWork) -> Response:
    """``work``'s answer for the authenticated caller it is given, or the error's, as Triton
    writes it."""
    try:
        caller = await access.check(request.headers.get("authorization"),
                                    request.headers.get("x-api-key"))
        answer = await work(caller)
    except ClientError as exc:
        return oip_error(exc.status, exc.message, exc.headers())
    except BackendError as exc:
        return oip_error(status_of(exc), exc.reason)
    except DependencyUnavailableError as exc:
        return oip_error(503, f"a dependency is unavailable: {exc}", [(b"retry-after", b"1")])
    for name, value in caller.headers:
        answer.headers[name.decode("latin-1")] = value.decode("latin-1")
    return answer


def oip_router(discovery: Discovery) -> APIRouter:
    """The ``/v2`` discovery routes."""
    router = APIRouter(prefix=PREFIX, tags=["Open Inference Protocol (Triton's)"])
    _health_routes(router, discovery)
    _server_routes(router, discovery)
    _model_routes(router, discovery)
    return router


def _health_routes(router: APIRouter, discovery: Discovery) -> None:
    @router.get("/health/live", summary="The gateway is alive (no credential needed)",
                responses=HEALTH_DOC, operation_id="server_live", response_class=Response)
    async def live() -> Response:
        return Response(status_code=200)

    @router.get("/health/ready", summary="Redis answers and Triton is ready (no credential "
                "needed)", responses=HEALTH_DOC, operation_id="server_ready",
                response_class=Response)
    async def ready() -> Response:
        return Response(status_code=200 if await discovery.serving() else 400)


def _server_routes(router: APIRouter, discovery: Discovery) -> None:
    @router.get("", summary="Ferry's name, version and the extensions it supports",
                responses=doc(ServerMetadata), openapi_extra=SECURED,
                operation_id="server_metadata")
    async def server_metadata(request: Request) -> Response:
        async def work() -> Response:
            return JSONResponse({"name": SERVER_NAME, "version": __version__,
                                 "extensions": list(EXTENSIONS)})
        return await guarded(discovery.access, request, work)

    @router.get("/models/stats", summary="Statistics of every model: Ferry's work, in Triton's "
                "shape", responses=doc(ModelStatistics, 400), openapi_extra=SECURED,
                operation_id="model_statistics_of_all")
    async def all_statistics(request: Request) -> Response:
        async def work() -> Response:
            return JSONResponse(await discovery.statistics("", ""))
        return await guarded(discovery.access, request, work)


def _model_routes(router: APIRouter, discovery: Discovery) -> None:
    answers = ModelAnswers(discovery)
    for tail, answer, summary, responses in (
            ("", answers.metadata, "The model's metadata (from Triton, cached a few seconds)",
             doc(ModelMetadata, 404)),
            ("/ready", answers.ready, "200 if Triton serves the model now, else 400", READY_DOC),
            ("/config", answers.config, "The model's configuration, as Triton completed it",
             doc(None, 404)),
            ("/stats", answers.statistics, "The model's statistics: Ferry's work (its queue, "
             "Triton's calls), in Triton's shape",
             doc(ModelStatistics, 400))):
        latest, versioned = _handlers(discovery.access, answer)
        name = f"model_{answer.__name__}"
        kind = Response if tail == "/ready" else JSONResponse  # readiness: no body
        router.add_api_route(f"/models/{{model}}{tail}", latest, methods=["GET"],
                             summary=summary, responses=responses, openapi_extra=SECURED,
                             operation_id=name, response_class=kind)
        router.add_api_route(f"/models/{{model}}/versions/{{version}}{tail}", versioned,
                             methods=["GET"], summary=f"{summary}: that version",
                             responses=responses, openapi_extra=SECURED,
                             operation_id=f"{name}_of_version", response_class=kind)


Answer = Callable[[str, str], Awaitable[Response]]
MODEL = FastApiPath(min_length=1, description="the model's name, as Triton knows it")
VERSION = FastApiPath(description="a version number", json_schema_extra={"pattern": "^[0-9]+$"})


def _handlers(access: Access, answer: Answer) -> tuple[Callable[..., Awaitable[Response]],
                                                       Callable[..., Awaitable[Response]]]:
    """The route for the version Triton's policy chooses, and the one for a named version."""
    async def latest(request: Request, model: str = MODEL) -> Response:
        return await guarded(access, request, lambda: answer(model, ""))

    async def versioned(request: Request, model: str = MODEL, version: str = VERSION
                        ) -> Response:
        return await guarded(access, request, lambda: answer(model, checked(version)))

    return latest, versioned


class ModelAnswers:
    """A model's metadata, readiness, configuration and statistics, as Triton answers them."""

    def __init__(self, discovery: Discovery) -> None:
        self.discovery = discovery
        self.backend = discovery.backend

    async def metadata(self, model: str, version: str) -> Response:
        return JSONResponse(await self.discovery.metadata(model, version))

    async def ready(self, model: str, version: str) -> Response:
        if await self.backend.model_ready(model, version):
            return Response(status_code=200)
        return oip_error(400, NOT_READY)

    async def config(self, model: str, version: str) -> Response:
        return JSONResponse(await self.backend.model_config(model, version))

    async def statistics(self, model: str, version: str) -> Response:
        return JSONResponse(await self.discovery.statistics(model, version))


class NotFound(ClientError):
    """A path Triton would not route: its answer is ``{"error": "Not Found"}``."""

    status = 404


def checked(version: str) -> str:
    """A version as Triton's routes take it: digits (none: the version policy chooses)."""
    if version and not version.isdigit():
        raise NotFound("not_found", "Not Found")
    return version


# -- OpenAPI --------------------------------------------------------------------------------

SECURED: dict[str, Any] = {"security": [{"bearer": []}, {"apiKey": []}, {}]}
HEALTH_DOC: dict[int | str, dict[str, Any]] = {
    200: {"description": "yes (no body)", "content": {}},
    400: {"description": "no (no body), as Triton answers", "content": {}},
}
_ERROR = {"application/json": {"schema": OipError.model_json_schema()}}
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "FERRY_AUTH is on and the credential is missing or not accepted",
          "content": _ERROR},
    429: {"description": "over the client's rate limit", "content": _ERROR},
    503: {"description": "Triton (or Redis) cannot be reached", "content": _ERROR},
}
READY_DOC: dict[int | str, dict[str, Any]] = {
    200: {"description": "ready (no body)", "content": {}},
    400: {"description": f"'{NOT_READY}': unknown, not loaded, or no such version",
          "content": _ERROR},
    404: {"description": "a version that is not a number", "content": _ERROR},
    **_AUTH_ERRORS,
}


def tidy_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """FastAPI documents a 422 for every route with parameters; a ``/v2`` path that does not
    fit is a 404, as Triton answers it."""
    for path, operations in document.get("paths", {}).items():
        if path == PREFIX or path.startswith(f"{PREFIX}/"):
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
    return document


def doc(model: type[BaseModel] | None, *errors: int) -> dict[int | str, dict[str, Any]]:
    """A route's responses: its 200 body (any JSON object without a model) and its errors."""
    ok: dict[str, Any] = {"description": "Triton's answer"}
    if model is None:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    else:
        ok["model"] = model
    answers: dict[int | str, dict[str, Any]] = {200: ok, **_AUTH_ERRORS}
    for status in (*errors, 400, 404):  # 400: also a version Triton cannot read
        answers[status] = {"description": "Triton's refusal (unknown model or version)",
                           "content": _ERROR}
    return answers
