"""``POST /v2/models/{m}[/versions/{v}]/infer``: Triton's infer, queued, durable and batched.

A request is read as Triton's HTTP endpoint reads it (JSON or the binary tensor extension,
gzip or deflate), checked against the model's interface (anything that differs is a 400 and
nothing is enqueued), and admitted as a Ferry task like any other (backlog limits, deadline
admission, ownership, the result cache and collapsing). The call is then held open until the
task ends, within its deadline, and answered as Triton answers: the outputs as JSON or binary
data, gzip or deflate as the client accepts. A client that goes away before its answer cancels
a task that has not reached Triton. ``Prefer: respond-async`` answers 202 with the task's id at
once instead; ``GET /v1/result/{id}`` then shows its record, whose output is the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import Receive

from ferry.access import Access, Caller
from ferry.oip.encoding import BodyTooLargeError, accepted_coding, decode_body, encode_body
from ferry.oip.hold import (
    HOLD_S,
    IDEMPOTENCY_KEY_HEADER,
    ROLLOUT_KEY_HEADER,
    TIMED_OUT,
    Held,
    Refused,
    TensorGateway,
    cancel_quietly,
    outcome,
)
from ferry.oip.request import (
    HEADER_LENGTH,
    InferRequest,
    encode_infer_response,
    header_length,
    parse_infer_request,
)
from ferry.oip.rest import MODEL, VERSION, checked, guarded_as, oip_error
from ferry.oip.schedule import TensorTask, tensor_task
from ferry.oip.spec import ModelInterface
from ferry.rollouts.rollout import Sticky
from ferry.tasks.idempotency import parse_idempotency_key
from ferry.tasks.record import StoredRecord
from ferry.telemetry.tracing import Tracing
from ferry.tensors import TensorError

RESULT_PREFIX = "/v1/result/"
INFER_ROUTE = "/v2/models/{model}/infer"


@dataclass(frozen=True)
class Inference:
    """Where an infer call's work is done: the gateway, each model's interface (through the
    catalog's short cache), the body size limit, and the traces (a call's span is the parent
    of its task's)."""

    gateway: TensorGateway
    interface: Callable[[str, str], Awaitable[ModelInterface]]
    max_body_bytes: int
    tracing: Tracing


def add_infer_routes(router: APIRouter, inference: Inference, access: Access) -> None:
    """``POST /models/{model}[/versions/{version}]/infer`` on the ``/v2`` router."""
    operation = InferOperation(inference)

    async def latest(request: Request, model: str = MODEL) -> Response:
        return await guarded_as(access, request,
                                lambda caller: operation.answer(request, model, "", caller))

    async def versioned(request: Request, model: str = MODEL, version: str = VERSION
                        ) -> Response:
        return await guarded_as(access, request, lambda caller: operation.answer(
            request, model, checked(version), caller))

    for path, route, name in (("/models/{model}/infer", latest, "model_infer"),
                              ("/models/{model}/versions/{version}/infer", versioned,
                               "model_infer_of_version")):
        router.add_api_route(path, route, methods=["POST"], operation_id=name,
                             summary="Inference, queued and batched; held open until it ends "
                             "(or 202 at once with Prefer: respond-async)",
                             responses=INFER_DOC, openapi_extra=INFER_EXTRA,
                             response_class=JSONResponse)


class InferOperation:
    """One infer call: read, check, admit, hold, answer."""

    def __init__(self, inference: Inference) -> None:
        self.inference = inference
        self.gateway = inference.gateway

    async def answer(self, request: Request, model: str, version: str,
                     caller: Caller) -> Response:
        try:
            body = await read_limited(request, self.inference.max_body_bytes)
            version = version or await self.gateway.version_for(model, "", Sticky(
                caller.client_for(""), request.headers.get(ROLLOUT_KEY_HEADER) or ""))
            # an unknown model or version is Triton's refusal (404), whatever the body holds
            interface = await self.inference.interface(model, version)
            parsed = self._parse(request, body)
            asynchronous = respond_async(request.headers.getlist("prefer"))
            task = tensor_task(interface, parsed, version, own_id=asynchronous)
            key = parse_idempotency_key(request.headers.get(IDEMPOTENCY_KEY_HEADER))
        except BodyTooLargeError as exc:
            return oip_error(413, str(exc))
        except TensorError as exc:
            return oip_error(400, str(exc))
        with self.inference.tracing.server_span(f"POST {INFER_ROUTE}", request.headers) as span:
            if asynchronous:
                answer = await self._queued(task, caller, key)
            else:
                answer = await self._held(request, parsed, task, caller, key)
            if span is not None:
                span.set_attribute("http.response.status_code", answer.status_code)
                span.set_attribute("ferry.model", model)
            return answer

    def _parse(self, request: Request, body: bytes) -> InferRequest:
        body = decode_body(body, request.headers.get("content-encoding"),
                           self.inference.max_body_bytes)
        return parse_infer_request(body, header_length(request.headers.get(HEADER_LENGTH)))

    async def _queued(self, task: TensorTask, caller: Caller, key: str | None) -> Response:
        async with self.gateway.held(task, caller, key) as held:
            location = f"{RESULT_PREFIX}{held.task_id}"
        return JSONResponse({"task_id": held.task_id, "status_url": location}, 202, headers={
            "location": location, "preference-applied": "respond-async"})

    async def _held(self, request: Request, parsed: InferRequest, task: TensorTask,
                    caller: Caller, key: str | None) -> Response:
        async with self.gateway.held(task, caller, key) as held:
            record = await until_end(held, task.timeout_s or HOLD_S, request.receive)
        if record is None:  # the client went away: its task is not wanted any more
            await cancel_quietly(self.gateway, held.task_id, caller)
            return oip_error(400, "the client closed its connection before the answer")
        return respond(record, parsed, task, request.headers.get("accept-encoding"))


async def read_limited(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    too_big = BodyTooLargeError(f"the request body exceeds the limit of {limit} bytes")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise too_big
    return bytes(body)


def respond_async(values: list[str]) -> bool:
    """Whether ``Prefer`` (RFC 7240) asks for ``respond-async``."""
    return any(preference.split(";", 1)[0].strip().lower() == "respond-async"
               for value in values for preference in value.split(","))


async def until_end(held: Held, timeout_s: float, receive: Receive) -> StoredRecord | None:
    """The task's record once final (or as it stands after ``timeout_s``); None if the client
    closed its connection first."""
    ending = asyncio.ensure_future(held.final(timeout_s))
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((ending, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in (ending, gone):
            waiting.cancel()
    if ending.done() and not ending.cancelled():
        return ending.result()
    return None


async def _disconnected(receive: Receive) -> None:
    """Returns when the client closes its connection (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def respond(record: StoredRecord, parsed: InferRequest, task: TensorTask,
            accept_encoding: str | None) -> Response:
    """The answer for a task's record: its outputs as the client asked, or Triton's error."""
    ended = outcome(record, task)
    if isinstance(ended, Refused):
        return oip_error(ended.failure.http, ended.message)
    encoded = encode_infer_response(
        task.request.model, ended.version, ended.outputs, request_id=parsed.id,
        binary=[t.name for t in ended.outputs if parsed.binary(t.name)])
    coding = accepted_coding(accept_encoding)
    headers = {"content-encoding": coding} if coding else {}
    if encoded.header_length is not None:
        headers[HEADER_LENGTH] = str(encoded.header_length)
    kind = "application/json" if encoded.header_length is None else "application/octet-stream"
    return Response(encode_body(encoded.body, coding), 200, headers, media_type=kind)


# -- OpenAPI --------------------------------------------------------------------------------

_ERROR = {"application/json": {"schema": {"type": "object", "required": ["error"],
                                          "properties": {"error": {"type": "string"}}}}}
_TENSOR = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
    "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer"}},
    "datatype": {"type": "string"}, "parameters": {"type": "object"}, "data": {}}}
INFER_EXTRA: dict[str, Any] = {
    "security": [{"bearer": []}, {"apiKey": []}, {}],
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"type": "object", "required": ["inputs"], "properties": {
            "id": {"type": "string"}, "parameters": {"type": "object"},
            "inputs": {"type": "array", "items": _TENSOR},
            "outputs": {"type": "array", "items": {"type": "object"}}}}},
        "application/octet-stream": {"schema": {
            "type": "string", "format": "binary",
            "description": "the binary tensor extension: a JSON header of "
                           "Inference-Header-Content-Length bytes, then the inputs' bytes"}}}},
}
INFER_DOC: dict[int | str, dict[str, Any]] = {
    200: {"description": "the outputs, as Triton answers them (JSON, or with the binary tensor "
                         "extension a JSON header of Inference-Header-Content-Length bytes and "
                         "the outputs' bytes)",
          "content": {"application/json": {"schema": {"type": "object"}},
                      "application/octet-stream": {"schema": {"type": "string",
                                                              "format": "binary"}}}},
    202: {"description": "Prefer: respond-async: the task's id; GET /v1/result/{task_id}",
          "content": {"application/json": {"schema": {"type": "object"}}}},
    400: {"description": "the request does not fit the model (what differs), or the model "
                         "is one Ferry cannot serve (stateful, decoupled)", "content": _ERROR},
    401: {"description": "FERRY_AUTH is on and the credential is missing or not accepted",
          "content": _ERROR},
    404: {"description": "no such model (Triton's answer)", "content": _ERROR},
    413: {"description": "the body (decoded) is over FERRY_MAX_BODY_BYTES", "content": _ERROR},
    429: {"description": "over a limit: backlog, deadline unmeetable, rate", "content": _ERROR},
    500: {"description": "the task failed", "content": _ERROR},
    503: {"description": f"'{TIMED_OUT}': the deadline passed; or a dependency is down",
          "content": _ERROR},
}
