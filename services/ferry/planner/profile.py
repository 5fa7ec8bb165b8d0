"""Measuring a model's t(B) on a real Triton: a sweep of batch sizes through Ferry's own gRPC
client, or the per-batch-size statistics Triton keeps from live traffic."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import service_pb2

from ferry import SERVER_NAME
from ferry.errors import BackendError, ConfigError
from ferry.planner.costs import DEFAULT_SIZES, CostModel, fit, points_from_stats, weigh
from ferry.stack.up import sample_image
from ferry.triton.base import ModelSpec
from ferry.triton.grpc_backend import TritonGrpcBackend, as_dict

__all__ = ["DEFAULT_SIZES", "from_statistics", "live_statistics", "payload", "sweep"]


def payload(spec: ModelSpec, size: int) -> bytes:
    """An input the model accepts: the bundled photo for an image model, else ``size`` bytes."""
    if spec.input_kind == "image":
        return sample_image().read_bytes()
    if spec.input_kind == "text":
        return b"ferry " * max(1, size // 6)
    return os.urandom(size)


async def sweep(triton_url: str, model: str, *, sizes: Sequence[int] = DEFAULT_SIZES,
                repeats: int = 10, payload_bytes: int = 1024, warmup: int = 2,
                sample: bytes | None = None) -> CostModel:
    """Time ``repeats`` calls at each batch size (up to the model's max_batch_size), after
    ``warmup`` untimed ones, and fit t(B) to them; every item is ``sample`` when given."""
    backend = TritonGrpcBackend(triton_url, infer_timeout_s=120.0)
    await backend.start()
    try:
        await refuse_ferry(backend, triton_url)
        spec = await backend.model_spec(model)
        samples: list[tuple[int, float]] = []
        for batch in sorted({min(s, spec.max_batch_size) for s in sizes if s >= 1}):
            payloads = [sample if sample is not None else payload(spec, payload_bytes)
                        for _ in range(batch)]
            for attempt in range(warmup + repeats):
                started = time.perf_counter()
                await backend.infer(spec, payloads)
                if attempt >= warmup:
                    samples.append((batch, time.perf_counter() - started))
    finally:
        await backend.close()
    return fit(weigh(samples), source="sweep", model=model)


async def refuse_ferry(backend: TritonGrpcBackend, url: str) -> None:
    """A ConfigError when ``url`` is Ferry's own gRPC port (it speaks Triton's protocol): a
    sweep through it would time Ferry's batching and its result cache, not the model."""
    try:
        ferry = (await backend.server_metadata()).get("name") == SERVER_NAME
    except BackendError as exc:  # Ferry with authentication on asks for a credential first
        if exc.code != "UNAUTHENTICATED":
            raise
        ferry = True
    if ferry:
        raise ConfigError(f"{url} is Ferry's gRPC port, not Triton's (it names itself "
                          "ferry, or asks for credentials as Triton does not): a sweep through "
                          "Ferry times its batching and its result cache, not the model. Give "
                          "Triton's own port (the 'triton' line of ferry up's banner; beside "
                          "ferry up, no --triton-url at all), or fit Ferry's live statistics "
                          "with --live-stats")


async def live_statistics(triton_url: str, model: str) -> dict[str, Any]:
    """Triton's statistics of ``model`` (the gRPC reply as a dict, in the documented shape)."""
    backend = TritonGrpcBackend(triton_url)
    await backend.start()
    try:
        reply = await backend.stub.ModelStatistics(
            service_pb2.ModelStatisticsRequest(name=model), timeout=backend.control_timeout_s)
    finally:
        await backend.close()
    return as_dict(reply)


def from_statistics(stats: dict[str, Any], model: str = "") -> CostModel:
    return fit(points_from_stats(stats, model), source="stats", model=model)
