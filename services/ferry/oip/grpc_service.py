"""Triton's gRPC service, ``inference.GRPCInferenceService``, on the gateway: queued, durable
and batched.

``tritonclient.grpc`` pointed at the gateway's gRPC port gets the answers Triton would give.
Health and metadata come from Triton as the REST routes' do. ``ModelInfer`` admits the request
as a task (as ``POST /v2/models/{m}/infer`` does) and holds the call until the task ends; a
client that cancels its call (or whose deadline passes) cancels a task that has not reached
Triton. ``ModelStreamInfer`` answers each request of the stream as its task ends, in whatever
order they end, each response carrying its request's ``id``; an error ends only that request
(``error_message``), not the stream. The parameter ``respond_async`` (bool) asks for the task's
id at once instead. Credentials travel as metadata (``authorization: Bearer ...`` or
``x-api-key``), trace context as ``traceparent``; errors are Triton's codes and words.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from tritonclient.grpc import service_pb2

from ferry import SERVER_NAME, __version__
from ferry.access import Access, Caller
from ferry.errors import BackendError, ClientError, DependencyUnavailableError, clip_echoes
from ferry.oip.grpc_codec import (
    accepted_response,
    infer_request,
    infer_response,
    message_from_json,
)
from ferry.oip.hold import (
    HOLD_S,
    IDEMPOTENCY_KEY_HEADER,
    ROLLOUT_KEY_HEADER,
    Failure,
    Refused,
    cancel_quietly,
    outcome,
)
from ferry.oip.infer import RESULT_PREFIX, Inference
from ferry.oip.rest import EXTENSIONS, Discovery
from ferry.oip.schedule import tensor_task
from ferry.rollouts.rollout import Sticky
from ferry.tasks.idempotency import parse_idempotency_key
from ferry.telemetry.metrics import GatewayMetrics
from ferry.tensors import TensorError

log = logging.getLogger(__name__)
T = TypeVar("T")
BUG = "the gateway failed to serve this request; the error is logged"
Metadata = dict[str, str]
Code = grpc.StatusCode

_CLIENT_CODES = {400: Code.INVALID_ARGUMENT, 401: Code.UNAUTHENTICATED,
                 403: Code.PERMISSION_DENIED, 404: Code.NOT_FOUND, 409: Code.FAILED_PRECONDITION,
                 413: Code.RESOURCE_EXHAUSTED, 429: Code.RESOURCE_EXHAUSTED,
                 503: Code.UNAVAILABLE}
_FAILURE_CODES = {Failure.UNAVAILABLE: Code.UNAVAILABLE, Failure.INTERNAL: Code.INTERNAL,
                  Failure.CANCELLED: Code.CANCELLED}


class RpcError(Exception):
    """A call's error: the status code and message the client gets."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        message = clip_echoes(message)  # Triton's words quote the names a call sent
        super().__init__(message)
        self.code = code
        self.message = message


def rpc_error(exc: Exception) -> RpcError | None:
    """The client's view of an error Ferry knows (None for a bug, which is raised)."""
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, TensorError):
        return RpcError(Code.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, ClientError):
        return RpcError(_CLIENT_CODES.get(exc.status, Code.INVALID_ARGUMENT), exc.message)
    if isinstance(exc, BackendError):
        return RpcError(backend_code(exc), exc.reason)
    if isinstance(exc, DependencyUnavailableError):
        return RpcError(Code.UNAVAILABLE, f"a dependency is unavailable: {exc}")
    return None


def rpc_failure(exc: Exception, method: str) -> RpcError:
    """The client's view of any error: Ferry's own as its status, a bug logged and INTERNAL
    (call it where the exception is being handled)."""
    failure = rpc_error(exc)
    if failure is None:
        log.exception("unexpected error serving %s", method)
        return RpcError(Code.INTERNAL, BUG)
    return failure


def backend_code(error: BackendError) -> grpc.StatusCode:
    """Triton's own code for its refusal; UNAVAILABLE when Triton could not be asked."""
    known = Code.__members__.get(error.code)
    if known is not None:
        return known
    return Code.UNAVAILABLE if error.transient or not error.code else Code.UNKNOWN


def metadata_of(context: grpc.aio.ServicerContext[Any, Any]) -> Metadata:
    """The call's metadata (keys lower case; the last value of a repeated key)."""
    return {key.lower(): value for key, value in context.invocation_metadata() or ()
            if isinstance(value, str)}


def refusal(what: str) -> Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]],
                                   Awaitable[NoReturn]]:
    """An RPC Ferry does not serve: UNIMPLEMENTED, saying what and why."""
    async def refuse(_service: Any, _request: Any,
                     context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
        await context.abort(Code.UNIMPLEMENTED, f"{what} is not supported by Ferry")
        raise AssertionError("abort raises")
    return refuse


Request = TypeVar("Request")
Response = TypeVar("Response")
Answer = Callable[["InferenceService", Request], Awaitable[Response]]
Handler = Callable[["InferenceService", Request, grpc.aio.ServicerContext[Any, Any]],
                   Awaitable[Response]]


def rpc(method: str, *, secured: bool = True) -> Callable[[Answer[Request, Response]],
                                                           Handler[Request, Response]]:
    """The servicer's handler of a unary RPC whose answer needs only its request: the caller
    authenticated (unless not ``secured``), the call counted, an error as its status."""
    def handler_of(answer: Answer[Request, Response]) -> Handler[Request, Response]:
        async def handle(service: InferenceService, request: Request,
                         context: grpc.aio.ServicerContext[Any, Any]) -> Response:
            return await service._unary(context, method, lambda _: answer(service, request),
                                        secured=secured)
        handle.__name__ = handle.__qualname__ = method
        return handle
    return handler_of


class InferenceService:
    """The servicer (every RPC of the service): each call authenticated, counted and answered
    as Triton answers."""

    def __init__(self, discovery: Discovery, inference: Inference,
                 metrics: GatewayMetrics) -> None:
        self.discovery = discovery
        self.backend = discovery.backend
        self.access: Access = discovery.access
        self.inference = inference
        self.gateway = inference.gateway
        self.metrics = metrics

    async def _caller(self, metadata: Metadata) -> Caller:
        return await self.access.check(metadata.get("authorization"),
                                       metadata.get("x-api-key"))

    async def _unary(self, context: grpc.aio.ServicerContext[Any, Any], method: str,
                     work: Callable[[Caller], Awaitable[T]], *, secured: bool = True) -> T:
        """``work``'s answer for the authenticated caller, or the error's status."""
        started, code = time.perf_counter(), Code.OK
        try:
            metadata = metadata_of(context)
            caller = await self._caller(metadata) if secured else Caller()
            answer = await work(caller)
            if caller.headers:
                context.set_trailing_metadata(tuple(
                    (name.decode("latin-1").lower(), value.decode("latin-1"))
                    for name, value in caller.headers))
            return answer
        except asyncio.CancelledError:
            code = Code.CANCELLED
            raise
        except Exception as exc:
            failure = rpc_failure(exc, method)
            code = failure.code
            await context.abort(failure.code, failure.message)
            raise  # abort raises; this is for the type checker
        finally:
            self.metrics.observe_rpc(method, code.name, time.perf_counter() - started)

    # -- health and metadata: each answered by ``_unary`` (``rpc`` makes the handler) -------

    @rpc("ServerLive", secured=False)
    async def ServerLive(self, _: service_pb2.ServerLiveRequest
                         ) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    @rpc("ServerReady", secured=False)
    async def ServerReady(self, _: service_pb2.ServerReadyRequest
                          ) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=await self.discovery.serving())

    @rpc("ServerMetadata")
    async def ServerMetadata(self, _: service_pb2.ServerMetadataRequest
                             ) -> service_pb2.ServerMetadataResponse:
        return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=__version__,
                                                  extensions=list(EXTENSIONS))

    @rpc("ModelReady")
    async def ModelReady(self, request: service_pb2.ModelReadyRequest
                         ) -> service_pb2.ModelReadyResponse:
        ready = await self.backend.model_ready(request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=ready)

    @rpc("ModelMetadata")
    async def ModelMetadata(self, request: service_pb2.ModelMetadataRequest
                            ) -> service_pb2.ModelMetadataResponse:
        document = await self.discovery.metadata(request.name, request.version)
        return message_from_json(document, service_pb2.ModelMetadataResponse())

    @rpc("ModelConfig")
    async def ModelConfig(self, request: service_pb2.ModelConfigRequest
                          ) -> service_pb2.ModelConfigResponse:
        reply = service_pb2.ModelConfigResponse()
        message_from_json(await self.backend.model_config(request.name, request.version),
                          reply.config)
        return reply

    @rpc("ModelStatistics")
    async def ModelStatistics(self, request: service_pb2.ModelStatisticsRequest
                              ) -> service_pb2.ModelStatisticsResponse:
        document = await self.discovery.statistics(request.name, request.version)
        return message_from_json(document, service_pb2.ModelStatisticsResponse())

    # -- inference -----------------------------------------------------------------------

    async def ModelInfer(self, request: service_pb2.ModelInferRequest,
                         context: grpc.aio.ServicerContext[Any, Any]
                         ) -> service_pb2.ModelInferResponse:
        metadata = metadata_of(context)
        return await self._unary(context, "ModelInfer", lambda caller: self._infer(
            request, caller, metadata, parse_idempotency_key(metadata.get(IDEMPOTENCY_KEY_HEADER))))

    async def _infer(self, message: service_pb2.ModelInferRequest, caller: Caller,
                     metadata: Metadata, key: str | None = None
                     ) -> service_pb2.ModelInferResponse:
        """Admit the request, hold it until its task ends, answer from its record. An
        unknown model or version is Triton's refusal (NOT_FOUND) before the inputs are read.
        With an idempotency key (a unary call's metadata; a stream's requests share their
        metadata, so theirs is not read), a retry of the call is held on the first one's task."""
        version = message.model_version or await self.gateway.version_for(
            message.model_name, "", Sticky(caller.client_for(""),
                                           metadata.get(ROLLOUT_KEY_HEADER, "")))
        interface = await self.inference.interface(message.model_name, version)
        request, asynchronous = infer_request(message)
        task = tensor_task(interface, request, version, own_id=asynchronous)
        with self.inference.tracing.server_span("ModelInfer", metadata):
            async with self.gateway.held(task, caller, key) as held:
                if asynchronous:
                    return accepted_response(task.request.model, version, request.id,
                                             held.task_id, f"{RESULT_PREFIX}{held.task_id}")
                try:
                    record = await held.final(task.timeout_s or HOLD_S)
                except asyncio.CancelledError:  # the client cancelled, or its deadline passed
                    await cancel_quietly(self.gateway, held.task_id, caller)
                    raise
        ended = outcome(record, task)
        if isinstance(ended, Refused):
            raise RpcError(_FAILURE_CODES[ended.failure], ended.message)
        return infer_response(task.request.model, ended.version, ended.outputs, request.id)

    async def ModelStreamInfer(
            self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
            context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        stream = _Stream(self, metadata_of(context))
        async for answer in stream.answers(request_iterator):
            yield answer

    async def stream_answer(self, message: service_pb2.ModelInferRequest,
                            metadata: Metadata) -> service_pb2.ModelStreamInferResponse:
        """One request of a stream, answered on its own: its response or its error."""
        started, code = time.perf_counter(), Code.OK
        try:
            caller = await self._caller(metadata)
            response = await self._infer(message, caller, metadata)
            return service_pb2.ModelStreamInferResponse(infer_response=response)
        except Exception as exc:
            failure = rpc_failure(exc, "ModelStreamInfer")
            code = failure.code
            return service_pb2.ModelStreamInferResponse(
                error_message=failure.message, infer_response=service_pb2.ModelInferResponse(
                    model_name=message.model_name, model_version=message.model_version,
                    id=message.id))
        finally:
            self.metrics.observe_rpc("ModelStreamInfer", code.name,
                                     time.perf_counter() - started)

    # -- what a remote front end cannot offer: UNIMPLEMENTED, with the reason ----------------

    SystemSharedMemoryStatus = SystemSharedMemoryRegister = SystemSharedMemoryUnregister = (
        refusal("shared memory (a remote front end cannot map it)"))
    CudaSharedMemoryStatus = CudaSharedMemoryRegister = CudaSharedMemoryUnregister = (
        refusal("CUDA shared memory (a remote front end cannot map it)"))
    RepositoryIndex = RepositoryModelLoad = RepositoryModelUnload = (
        refusal("the model repository API (manage Triton directly)"))
    TraceSetting = refusal("Triton's trace settings (Ferry traces with OpenTelemetry)")
    LogSettings = refusal("Triton's log settings (manage Triton directly)")


class _Stream:
    """One ``ModelStreamInfer`` call: every request answered as its task ends; the stream ends
    once the client has sent its last request and every answer has gone. A stream the client
    cancels cancels the tasks of its requests still waiting."""

    def __init__(self, service: InferenceService, metadata: Metadata) -> None:
        self.service = service
        self.metadata = metadata
        self.queue: asyncio.Queue[service_pb2.ModelStreamInferResponse | None] = asyncio.Queue()
        self.working: set[asyncio.Task[None]] = set()

    async def answers(self, requests: AsyncIterator[service_pb2.ModelInferRequest]
                      ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        reader = asyncio.ensure_future(self._read(requests))
        try:
            while (answer := await self.queue.get()) is not None:
                yield answer
            await reader  # its error, if reading failed
        finally:
            for task in (reader, *self.working):
                task.cancel()

    async def _read(self, requests: AsyncIterator[service_pb2.ModelInferRequest]) -> None:
        try:
            async for message in requests:
                task = asyncio.ensure_future(self._answer(message))
                self.working.add(task)
                task.add_done_callback(self.working.discard)
            while self.working:
                await asyncio.wait(set(self.working))
        finally:
            self.queue.put_nowait(None)

    async def _answer(self, message: service_pb2.ModelInferRequest) -> None:
        """Its answer or its error (``stream_answer`` makes even a bug an answer)."""
        self.queue.put_nowait(await self.service.stream_answer(message, self.metadata))
