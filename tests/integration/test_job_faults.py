"""A 10,000-item job through faults, against real servers: a batcher killed with SIGKILL, a
Redis restart, a cancel half-way, a retry of failed items. Each ends with every custom_id once.
(The gateway killed mid-job: ``test_jobs.py``.)"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferry.batcher.worker import Batcher
from ferry.settings import BatcherSettings, to_env
from ferry.stack.ports import free_port
from ferry.stack.redis_server import start_redis
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    gateway_settings,
    running_gateway,
    running_stack,
)
from tests.integration.test_jobs import (
    finished,
    lines,
    manifest,
    once_each,
    progress,
    submit,
    text_items,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ITEMS = 10_000


async def collected(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    results = await lines(client, f"/v1/jobs/{job_id}/results")
    once_each(results, ITEMS)
    return results


async def test_a_batcher_killed_mid_job_loses_no_item(
        redis_url: str, triton_server: TritonServer, tmp_path: Path) -> None:
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url, job_store_dir=str(tmp_path / "jobs"))
    doomed = batcher_settings(redis_url, url)
    proc = subprocess.Popen([sys.executable, "-m", "ferry", "batcher"],
                            env={**os.environ, **to_env(doomed, BatcherSettings)})
    try:
        async with running_gateway(settings) as client:
            job = await submit(client, manifest(text_items(ITEMS)))
            await progress(client, job["job_id"], 1000)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            rescuer = Batcher.from_settings(batcher_settings(
                redis_url, url, claim_idle_ms=1000, claim_interval_ms=300))
            await rescuer.start()
            try:
                done = await finished(client, job["job_id"], timeout_s=180)
            finally:
                await rescuer.stop()
            assert done["status"] == "completed", done
            assert done["request_counts"]["succeeded"] == ITEMS
            await collected(client, job["job_id"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_a_redis_restart_mid_job_loses_no_item(
        triton_server: TritonServer, tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "redis"
    proc, redis_url = start_redis(data, port=port, persist=True)
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url, job_store_dir=str(tmp_path / "jobs"),
                                redis_cluster=False, job_lease_s=3.0)
    try:
        # Batches whose completion failed while Redis was away are reclaimed (2 s idle here).
        rescue = {"claim_idle_ms": 2000, "claim_interval_ms": 500, "redis_cluster": False}
        async with running_stack(settings, batcher_settings(redis_url, url,
                                                            **rescue)) as stack:
            job = await submit(stack.client, manifest(text_items(ITEMS)))
            await progress(stack.client, job["job_id"], 2000)
            proc.stop(grace_s=10)  # SIGTERM: Redis writes its append-only file and exits
            await asyncio.sleep(1.0)  # an outage of a second: time itself must pass
            proc, _ = start_redis(data, port=port, persist=True)
            done = await finished(stack.client, job["job_id"], timeout_s=180)
            assert done["status"] == "completed", done
            assert done["request_counts"]["succeeded"] == ITEMS
            await collected(stack.client, job["job_id"])
    finally:
        proc.stop(grace_s=5)


@pytest.fixture
async def stack(redis_url: str, triton_server: TritonServer, tmp_path: Path
                ) -> AsyncIterator[httpx.AsyncClient]:
    images = tmp_path / "images"
    images.mkdir()
    settings = gateway_settings(redis_url, triton_server.grpc_url,
                                job_store_dir=str(tmp_path / "jobs"),
                                job_sources=f"file://{images}/")
    async with running_stack(settings, batcher_settings(redis_url,
                                                        triton_server.grpc_url)) as running:
        yield running.client


async def test_a_job_cancelled_half_way_keeps_every_result_it_has(
        stack: httpx.AsyncClient) -> None:
    job = await submit(stack, manifest(text_items(ITEMS)))
    await progress(stack, job["job_id"], ITEMS // 2)
    cancel = await stack.delete(f"/v1/jobs/{job['job_id']}")
    assert cancel.status_code == 202
    done = await finished(stack, job["job_id"], timeout_s=120)
    counts = done["request_counts"]
    assert done["status"] == "cancelled" and counts["pending"] == 0
    assert counts["succeeded"] >= ITEMS // 2 and counts["cancelled"] > 0
    assert counts["succeeded"] + counts["cancelled"] == ITEMS
    results = await collected(stack, job["job_id"])
    assert sum(r["status"] == "succeeded" for r in results) == counts["succeeded"]
    output = await lines(stack, f"/v1/jobs/{job['job_id']}/results", file="output")
    assert len(output) == counts["succeeded"]  # the output file holds every one kept


async def test_a_retry_of_a_thousand_failed_items_runs_them_alone(
        stack: httpx.AsyncClient, tmp_path: Path) -> None:
    images = tmp_path / "images"
    missing = set(range(0, ITEMS, 10))
    for i in range(ITEMS):
        if i not in missing:
            (images / f"{i}.bin").write_bytes(b"image %d" % i)
    items = [{"custom_id": f"item-{i}", "uri": f"file://{images}/{i}.bin"} for i in range(ITEMS)]
    job = await submit(stack, manifest(items))
    done = await finished(stack, job["job_id"], timeout_s=120)
    assert done["status"] == "completed" and done["request_counts"]["failed"] == len(missing)
    first = {r["custom_id"]: r for r in await collected(stack, job["job_id"])}
    for i in missing:
        (images / f"{i}.bin").write_bytes(b"image %d" % i)
    assert (await stack.post(f"/v1/jobs/{job['job_id']}/retry")).status_code == 202
    done = await finished(stack, job["job_id"], timeout_s=120)
    assert done["status"] == "completed" and done["request_counts"]["succeeded"] == ITEMS
    again = {r["custom_id"]: r for r in await collected(stack, job["job_id"])}
    rerun = {cid for cid in again if again[cid].get("task_id") != first[cid].get("task_id")}
    assert rerun == {f"item-{i}" for i in missing}  # only the failed ones ran again
