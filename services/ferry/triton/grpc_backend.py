"""Triton over gRPC (``tritonclient.grpc.aio``); gRPC errors become Ferry's errors here."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from ferry.errors import (
    BackendError,
    PermanentBackendError,
    TransientBackendError,
    UnknownModelError,
)
from ferry.triton.base import Inferred, ModelSpec, split_rows, stack_payloads

# gRPC codes after which the same call may well succeed.
_TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED",
                        "CANCELLED", "UNKNOWN"})


def translate(exc: Exception, what: str) -> BackendError:
    """A tritonclient/gRPC exception as transient or permanent, or as an unknown model."""
    if isinstance(exc, InferenceServerException):
        code, message = str(exc.status() or ""), str(exc.message() or exc)
    elif isinstance(exc, grpc.aio.AioRpcError):
        code, message = str(exc.code()), str(exc.details())
    else:
        code, message = "", str(exc)
    code = code.removeprefix("StatusCode.")
    text = f"{what}: {code or type(exc).__name__}: {message}"
    if code == "NOT_FOUND" or "unknown model" in message.lower():
        return UnknownModelError(text)
    if code in _TRANSIENT or isinstance(exc, (ConnectionError, TimeoutError)):
        return TransientBackendError(text)
    return PermanentBackendError(text)


class TritonGrpcBackend:
    """Whole batches to Triton, one gRPC infer call each; model specs cached for ``spec_ttl_s``."""

    def __init__(self, url: str, *, infer_timeout_s: float = 30.0, control_timeout_s: float = 5.0,
                 spec_ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.infer_timeout_s = infer_timeout_s
        self.control_timeout_s = control_timeout_s
        self.spec_ttl_s = spec_ttl_s
        self.clock = clock
        self._client: triton.InferenceServerClient | None = None
        self._specs: dict[str, tuple[float, ModelSpec]] = {}

    @property
    def client(self) -> triton.InferenceServerClient:
        if self._client is None:
            raise RuntimeError("TritonGrpcBackend.start() was not called")
        return self._client

    async def start(self) -> None:
        if self._client is None:
            self._client = triton.InferenceServerClient(self.url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def server_ready(self) -> bool:
        """Triton's readiness (with --strict-readiness, false while any model is not ready)."""
        try:
            return bool(await self.client.is_server_ready(client_timeout=self.control_timeout_s))
        except (InferenceServerException, grpc.aio.AioRpcError, OSError):
            return False

    async def server_live(self) -> bool:
        """Whether Triton can be reached and answers at all: the test for an outage."""
        try:
            return bool(await self.client.is_server_live(client_timeout=self.control_timeout_s))
        except (InferenceServerException, grpc.aio.AioRpcError, OSError):
            return False

    async def ready_models(self) -> list[str]:
        """Names of the models Triton reports READY."""
        try:
            index = await self.client.get_model_repository_index(
                as_json=True, client_timeout=self.control_timeout_s)
        except (InferenceServerException, grpc.aio.AioRpcError) as exc:
            raise translate(exc, "model index") from exc
        return sorted({str(m["name"]) for m in index.get("models", [])
                       if m.get("state") == "READY"})

    async def model_spec(self, model: str, *, refresh: bool = False) -> ModelSpec:
        cached = self._specs.get(model)
        if refresh or cached is None or self.clock() - cached[0] > self.spec_ttl_s:
            cached = (self.clock(), await self._fetch_spec(model))
            self._specs[model] = cached
        return cached[1]

    async def _fetch_spec(self, model: str) -> ModelSpec:
        try:
            metadata: Any = await self.client.get_model_metadata(
                model, as_json=True, client_timeout=self.control_timeout_s)
            config: Any = await self.client.get_model_config(
                model, as_json=True, client_timeout=self.control_timeout_s)
        except (InferenceServerException, grpc.aio.AioRpcError) as exc:
            raise translate(exc, f"model {model!r}") from exc
        return ModelSpec.from_triton(metadata, config.get("config", config))

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes]) -> Inferred:
        """One infer call for the whole batch; per-request output rows in input order."""
        tensor = stack_payloads(payloads)
        infer_input = triton.InferInput(spec.input_name, list(tensor.shape), "BYTES")
        infer_input.set_data_from_numpy(tensor)
        outputs = [triton.InferRequestedOutput(name) for name in spec.outputs]
        try:
            result = await self.client.infer(
                spec.name, [infer_input], outputs=outputs, client_timeout=self.infer_timeout_s)
        except (InferenceServerException, grpc.aio.AioRpcError) as exc:
            if isinstance(translate(exc, ""), UnknownModelError):
                self._specs.pop(spec.name, None)
            raise translate(exc, f"infer {spec.name!r} x{len(payloads)}") from exc
        arrays = {name: result.as_numpy(name) for name in spec.outputs}
        missing = [name for name, array in arrays.items() if array is None]
        if missing:
            raise PermanentBackendError(f"infer {spec.name!r}: outputs {missing} missing")
        rows = split_rows({k: v for k, v in arrays.items() if v is not None}, len(payloads))
        return Inferred(rows, str(result.get_response().model_version or spec.version))
