"""The protocol's statistics count Ferry's own work (docs/oip.md, "Statistics"): two gateways
and two batchers against a real Redis and Triton, requests over REST and gRPC, some answered by
Ferry's result cache; every request is counted once, the rows Triton ran are Triton's own count,
and REST and gRPC give the same answer, in the shape Triton gives its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
from tritonclient.grpc import InferInput

from ferry.triton.http_json import triton_json
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, gateway_settings, running_batchers, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "mix"  # FP32 [4] and INT32 [2] in (tests/tensor_models.py)
REST_REQUESTS, GRPC_REQUESTS, GRPC_ROWS, REPEATS = 6, 4, 2, 5


def rest_body(n: int) -> dict[str, Any]:
    """A one-row request, distinct for each ``n``."""
    return {"inputs": [
        {"name": "VALUES", "datatype": "FP32", "shape": [1, 4], "data": [n, 0.5, 0.25, 1.0]},
        {"name": "STEPS", "datatype": "INT32", "shape": [1, 2], "data": [n, 7]}]}


def grpc_inputs(n: int) -> list[InferInput]:
    """A request of ``GRPC_ROWS`` rows, distinct for each ``n``."""
    values = InferInput("VALUES", [GRPC_ROWS, 4], "FP32")
    values.set_data_from_numpy(np.full((GRPC_ROWS, 4), 1000.0 + n, dtype=np.float32))
    steps = InferInput("STEPS", [GRPC_ROWS, 2], "INT32")
    steps.set_data_from_numpy(np.full((GRPC_ROWS, 2), n, dtype=np.int32))
    return [values, steps]


async def until(read: Callable[[], Awaitable[dict[str, Any]]],
                done: Callable[[dict[str, Any]], bool], timeout_s: float = 10.0
                ) -> dict[str, Any]:
    """``read``'s answer once ``done`` says so (its last one after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    answer = await read()
    while not done(answer) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        answer = await read()
    return answer


def version_one(stats: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [s for s in stats["model_stats"] if s["version"] == "1"]
    assert len(found) == 1
    return found[0]


def shape(stats: dict[str, Any]) -> list[tuple[str, str, list[str], list[str]]]:
    return [(s["name"], s["version"], sorted(s), sorted(s["inference_stats"]))
            for s in stats["model_stats"]]


async def test_every_request_is_counted_once_across_gateways_and_batchers(
        redis_url: str, triton_server: TritonServer,
        triton: triton_http.InferenceServerClient) -> None:
    started_ms = int(time.time() * 1000)
    theirs_before = version_one(triton.get_inference_statistics(MODEL))
    first, second = (gateway_settings(redis_url, triton_server.grpc_url) for _ in range(2))
    batchers = [batcher_settings(redis_url, triton_server.grpc_url) for _ in range(2)]
    async with serving(first) as a, serving(second) as b, running_batchers(*batchers), \
            httpx.AsyncClient(timeout=30) as http:
        grpc_client = triton_grpc_aio.InferenceServerClient(b.grpc)
        answers = await asyncio.gather(
            *(http.post(f"{a.http}/v2/models/{MODEL}/infer", json=rest_body(n))
              for n in range(REST_REQUESTS)),
            *(grpc_client.infer(MODEL, grpc_inputs(n)) for n in range(GRPC_REQUESTS)))
        assert all(r.status_code == 200 for r in answers[:REST_REQUESTS])
        repeats = [await http.post(f"{b.http}/v2/models/{MODEL}/infer", json=rest_body(0))
                   for _ in range(REPEATS)]  # each answered by Ferry's result cache
        assert all(r.json() == answers[0].json() for r in repeats)
        served = REST_REQUESTS + GRPC_REQUESTS + REPEATS

        async def rest() -> dict[str, Any]:
            return dict((await http.get(f"{a.http}/v2/models/{MODEL}/stats")).json())

        ours = await until(rest, lambda s: version_one(s)["inference_stats"]["success"]["count"]
                           >= served)
        by_grpc = triton_json(await grpc_client.get_inference_statistics(MODEL))
        await grpc_client.close()
    rows = REST_REQUESTS + GRPC_REQUESTS * GRPC_ROWS

    async def tritons() -> dict[str, Any]:  # Triton counts a call after its answer went out
        return dict(triton.get_inference_statistics(MODEL))

    theirs = await until(tritons, lambda s: version_one(s)["inference_count"]
                         - theirs_before["inference_count"] >= rows)
    assert by_grpc == ours and shape(ours) == shape(theirs)
    mine, triton_after = version_one(ours), version_one(theirs)
    stats = mine["inference_stats"]
    assert stats["success"]["count"] == stats["queue"]["count"] == served
    assert stats["compute_infer"]["count"] == REST_REQUESTS + GRPC_REQUESTS
    assert stats["compute_input"]["count"] == stats["compute_output"]["count"] == \
        stats["compute_infer"]["count"]
    assert stats["cache_hit"]["count"] == REPEATS and stats["fail"]["count"] == 0
    assert mine["inference_count"] == rows == \
        triton_after["inference_count"] - theirs_before["inference_count"]
    calls = mine["batch_stats"]
    assert mine["execution_count"] == sum(c["compute_infer"]["count"] for c in calls)
    assert rows == sum(c["batch_size"] * c["compute_infer"]["count"] for c in calls)
    assert mine["execution_count"] >= \
        triton_after["execution_count"] - theirs_before["execution_count"]  # Triton may join
    assert stats["queue"]["ns"] > 0 and stats["compute_infer"]["ns"] > 0
    # a task's time is its queue and its call; a shared answer's, its admission (ns rounding)
    assert abs(stats["success"]["ns"] - stats["queue"]["ns"] - stats["compute_infer"]["ns"]
               - stats["cache_hit"]["ns"]) <= served
    assert started_ms <= mine["last_inference"] <= int(time.time() * 1000)
