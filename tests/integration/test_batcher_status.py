"""The batcher's own endpoint: /metrics, /healthz and /readyz (Redis reachable, Triton open),
against real servers; readiness drops when its Redis goes away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from ferry.batcher.worker import Batcher
from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.redis_server import start_redis
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings

pytestmark = pytest.mark.integration


async def test_health_readiness_and_metrics(triton_server: TritonServer, tmp_path: Path) -> None:
    redis_proc, redis_url = start_redis(tmp_path / "redis")
    port = free_port()
    batcher = Batcher.from_settings(batcher_settings(
        redis_url, triton_server.grpc_url, metrics_port=port, owned_partitions="0-7",
        claim_interval_ms=200))
    await batcher.start()
    base = f"http://{LOOPBACK}:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            live, ready = await client.get("/healthz"), await client.get("/readyz")
            assert live.status_code == 200 and live.json()["loops"] == "running"
            assert ready.status_code == 200
            assert ready.json() == {"ok": True, "redis": "ok", "triton": "ok",
                                    "partitions": "0,1,2,3,4,5,6,7"}
            await batcher.depth_rounds.next(timeout_s=5)  # it measures the owned partitions
            metrics = await client.get("/metrics")
            assert "ferry_batch_size" in metrics.text and metrics.status_code == 200
            assert 'ferry_partition_depth{partition="7"} 0.0' in metrics.text
            assert 'ferry_partition_pending{partition="0"} 0.0' in metrics.text
            assert 'partition="8"' not in metrics.text  # not this batcher's
            assert (await client.get("/nowhere")).status_code == 404
            assert (await client.post("/readyz")).status_code == 405
            redis_proc.stop(grace_s=5)  # Redis goes away: the batcher is not ready any more

            async def not_ready() -> bool:
                return (await client.get("/readyz")).status_code == 503

            assert await wait_until_async(not_ready, 15)
            answer = (await client.get("/readyz")).json()
            assert "reads failed" in answer["redis"]
            assert (await client.get("/healthz")).status_code == 200  # alive: it waits it out
    finally:
        await batcher.stop()
        redis_proc.stop(grace_s=5)
    with pytest.raises(httpx.ConnectError):  # stopped: the port is free again
        httpx.get(f"{base}/healthz", timeout=2)


async def wait_until_async(predicate: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.2)
    return False
