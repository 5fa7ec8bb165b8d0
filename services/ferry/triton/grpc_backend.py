"""Triton over gRPC, through the service stubs that ship with ``tritonclient``.

The batcher calls ``ModelInfer`` on the stub with the batch packed into ``raw_input_contents``
and decodes ``raw_output_contents`` itself (``ferry.triton.tensors``): tritonclient's
``InferInput``/``as_numpy`` wrappers go through numpy object arrays, which cost about a fifth of a
millisecond more per batch of 64. gRPC errors become Ferry's errors here, and only here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.errors import PermanentBackendError, UnknownModelError
from ferry.tensors import Tensor, pack_bytes
from ferry.triton.base import Inferred, ModelSpec, instances_of
from ferry.triton.grpc_errors import translate
from ferry.triton.http_infer import HttpInferClient, bytes_batch_body, tensor_body
from ferry.triton.http_json import triton_json
from ferry.triton.oip import InferredTensors, infer_tensors, model_infer_request, reply_tensors
from ferry.triton.tensors import Rows, output_rows

_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1),
                    ("grpc.max_receive_message_length", -1),
                    # A server that was down (starting, restarted, added to the pool) is tried
                    # again within a second, not after gRPC's backoff of up to two minutes.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000)]


def as_dict(message: Message) -> dict[str, Any]:
    """A protobuf reply in the JSON shape Triton's HTTP endpoint gives (``http_json``)."""
    return triton_json(message)


def infer_request(spec: ModelSpec, payloads: Sequence[bytes],
                  version: str = "") -> service_pb2.ModelInferRequest:
    """One request for the whole batch: a [B, 1] BYTES tensor, every output asked for, of
    ``version`` ('' : Triton's version policy picks)."""
    request = service_pb2.ModelInferRequest(model_name=spec.name, model_version=version)
    tensor = request.inputs.add()
    tensor.name = spec.input_name
    tensor.datatype = "BYTES"
    tensor.shape.extend((len(payloads), 1))
    for name in spec.outputs:
        request.outputs.add().name = name
    request.raw_input_contents.append(pack_bytes(payloads))
    return request


def response_rows(spec: ModelSpec, response: service_pb2.ModelInferResponse,
                  batch: int) -> list[Rows]:
    """Per-request rows of every output the model declared, in input order."""
    raws = response.raw_output_contents
    return split_rows(spec, {out.name: (out.datatype, out.shape, raws[i])
                             for i, out in enumerate(response.outputs) if i < len(raws)}, batch)


def split_rows(spec: ModelSpec, found: Mapping[str, tuple[str, Sequence[int], bytes]],
               batch: int) -> list[Rows]:
    """Per-request rows of every output the model declared (``found``: datatype, shape and raw
    contents by output name, from either protocol), in input order."""
    missing = [name for name in spec.outputs if name not in found]
    if missing:
        raise PermanentBackendError(f"infer {spec.name!r}: outputs {missing} missing")
    rows: list[Rows] = [{} for _ in range(batch)]
    for name in spec.outputs:
        datatype, shape, raw = found[name]
        for row, value in zip(rows, output_rows(name, datatype, shape, raw, batch),
                              strict=True):
            row[name] = value
    return rows


@dataclass(frozen=True)
class TlsFiles:
    """gRPC over TLS: the CA that verifies Triton (None: the system's), and a client
    certificate and key for mutual TLS (optional). Files are read when the channel opens."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as file:
                return file.read()

        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))


class TritonGrpcBackend:
    """Whole batches to Triton, one infer call each (over gRPC, or over HTTP when given an
    ``HttpInferClient``: the data plane); model specs cached for ``spec_ttl_s``."""

    def __init__(self, url: str, *, infer_timeout_s: float = 30.0, control_timeout_s: float = 5.0,
                 spec_ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 tls: TlsFiles | None = None, http: HttpInferClient | None = None,
                 server_name: str = "") -> None:
        self.http = http
        self.server_name = server_name  # TLS: the name its certificate is for, when url is an IP
        self.url = url
        self.tls = tls
        self.infer_timeout_s = infer_timeout_s
        self.control_timeout_s = control_timeout_s
        self.spec_ttl_s = spec_ttl_s
        self.clock = clock
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._specs: dict[str, tuple[float, ModelSpec]] = {}

    @property
    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if self._stub is None:
            raise RuntimeError("TritonGrpcBackend.start() was not called")
        return self._stub

    async def start(self) -> None:
        if self._channel is None:
            if self.tls is None:
                self._channel = grpc.aio.insecure_channel(self.url, options=_CHANNEL_OPTIONS)
            else:
                options = _CHANNEL_OPTIONS + ([("grpc.ssl_target_name_override",
                                                self.server_name)] if self.server_name else [])
                self._channel = grpc.aio.secure_channel(self.url, self.tls.credentials(),
                                                        options=options)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None

    async def server_ready(self) -> bool:
        """Triton's readiness (with --strict-readiness, false while any model is not ready)."""
        try:
            reply = await self.stub.ServerReady(service_pb2.ServerReadyRequest(),
                                                timeout=self.control_timeout_s)
        except (grpc.aio.AioRpcError, OSError):
            return False
        return bool(reply.ready)

    async def server_live(self) -> bool:
        """Whether Triton can be reached and answers at all: the test for an outage."""
        try:
            reply = await self.stub.ServerLive(service_pb2.ServerLiveRequest(),
                                               timeout=self.control_timeout_s)
        except (grpc.aio.AioRpcError, OSError):
            return False
        return bool(reply.live)

    async def ready_models(self) -> list[str]:
        """Names of the models Triton reports READY."""
        try:
            index = await self.stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(),
                                                    timeout=self.control_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, "model index") from exc
        return sorted({m.name for m in index.models if m.state == "READY"})

    async def model_spec(self, model: str, *, refresh: bool = False) -> ModelSpec:
        cached = self._specs.get(model)
        if refresh or cached is None or self.clock() - cached[0] > self.spec_ttl_s:
            cached = (self.clock(), await self._fetch_spec(model))
            self._specs[model] = cached
        return cached[1]

    async def _fetch_spec(self, model: str) -> ModelSpec:
        metadata = await self.model_metadata(model)
        config = await self.model_config(model)
        spec = ModelSpec.from_triton(metadata, config)
        return replace(spec, instances=await instances_of(self, config))

    async def _ask(self, call: Callable[..., Any], request: Message, what: str) -> Any:
        """One control call's reply; its error translated."""
        try:
            return await call(request, timeout=self.control_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, what) from exc

    async def server_metadata(self) -> dict[str, Any]:
        """Triton's name, version and extensions."""
        return as_dict(await self._ask(self.stub.ServerMetadata,
                                       service_pb2.ServerMetadataRequest(), "server metadata"))

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's name, versions, platform, inputs and outputs."""
        request = service_pb2.ModelMetadataRequest(name=model, version=version)
        return as_dict(await self._ask(self.stub.ModelMetadata, request, f"model {model!r}"))

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's configuration, as Triton completed it."""
        request = service_pb2.ModelConfigRequest(name=model, version=version)
        reply = await self._ask(self.stub.ModelConfig, request, f"model {model!r}")
        return as_dict(reply.config)

    async def model_ready(self, model: str, version: str = "") -> bool:
        """Whether Triton serves the model (that version) now; False for an unknown one."""
        request = service_pb2.ModelReadyRequest(name=model, version=version)
        return bool((await self._ask(self.stub.ModelReady, request, f"model {model!r}")).ready)

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics of the model (of every model, without a name)."""
        request = service_pb2.ModelStatisticsRequest(name=model, version=version)
        return as_dict(await self._ask(self.stub.ModelStatistics, request,
                                       f"statistics of {model!r}"))

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes],
                    version: str = "") -> Inferred:
        """One infer call for the whole batch (of ``version``; '' : Triton's policy picks);
        per-request output rows in input order."""
        if self.http is not None:
            return await self._infer_http(self.http, spec, payloads, version)
        try:
            response = await self.stub.ModelInfer(infer_request(spec, payloads, version),
                                                  timeout=self.infer_timeout_s)
        except grpc.aio.AioRpcError as exc:
            error = translate(exc, f"infer {spec.name!r} x{len(payloads)}")
            if isinstance(error, UnknownModelError):
                self._specs.pop(spec.name, None)
            raise error from exc
        return Inferred(response_rows(spec, response, len(payloads)),
                        response.model_version or spec.version)

    async def _infer_http(self, http: HttpInferClient, spec: ModelSpec,
                          payloads: Sequence[bytes], version: str) -> Inferred:
        body = bytes_batch_body(spec.input_name, pack_bytes(payloads), len(payloads),
                                spec.outputs)
        try:
            reply = await http.infer(spec.name, version, body)
        except UnknownModelError:
            self._specs.pop(spec.name, None)
            raise
        found = {out.name: (out.datatype, out.shape, out.raw) for out in reply.outputs}
        return Inferred(split_rows(spec, found, len(payloads)), reply.model_version or spec.version)

    async def infer_tensors(self, model: str, version: str, inputs: Sequence[Tensor],
                            outputs: Sequence[str] = (), request_id: str = "") -> InferredTensors:
        """One infer call with the batch's tensors (already joined along the batch dimension);
        every output asked for (none: all), its errors translated as ``infer``'s are."""
        if self.http is not None:
            reply = await self.http.infer(model, version, tensor_body(inputs, outputs, request_id))
            return reply_tensors(reply, f"infer {model!r}")
        request = model_infer_request(model, version, inputs, outputs, request_id)
        return await infer_tensors(self.stub, request, self.infer_timeout_s)
