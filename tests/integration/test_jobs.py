"""Bulk jobs against a real Redis and Triton: a manifest in, every item's result out once."""

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
import orjson
import pytest
import redis

from ferry import cli, keys
from ferry.batcher.worker import Batcher
from ferry.settings import GatewaySettings, to_env
from ferry.stack.ports import http_ok
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    gateway_settings,
    running_gateway,
    running_stack,
    serving,
    stream_lengths,
    task_keys,
    wait_until,
)

pytestmark = pytest.mark.integration
NDJSON = {"Content-Type": "application/x-ndjson"}


def manifest(items: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(item) + b"\n" for item in items)


def text_items(count: int, poison_every: int = 0) -> list[dict[str, Any]]:
    return [{"custom_id": f"item-{i}",
             "input": ("poison " if poison_every and i % poison_every == 0 else "") + f"text {i}"}
            for i in range(count)]


async def submit(client: httpx.AsyncClient, body: bytes, **params: str) -> dict[str, Any]:
    response = await client.post("/v1/jobs", content=body, headers=NDJSON,
                                 params={"model": "sim", **params})
    assert response.status_code == 202, response.text
    doc: dict[str, Any] = response.json()
    return doc


async def finished(client: httpx.AsyncClient, job_id: str, timeout_s: float = 60
                   ) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(int(timeout_s * 10)):
        doc = await job_record(client, job_id)
        if doc.get("status") in ("completed", "failed", "cancelled", "expired"):
            return doc
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {doc}")


async def job_record(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """The job's record; {} for a 503 (Redis away a moment: a client tries again)."""
    response = await client.get(f"/v1/jobs/{job_id}")
    if response.status_code == 503:
        return {}
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    return doc


async def lines(client: httpx.AsyncClient, url: str, **params: str) -> list[dict[str, Any]]:
    response = await client.get(url, params=params)
    assert response.status_code == 200, response.text
    return [orjson.loads(line) for line in response.content.splitlines()]


def once_each(results: list[dict[str, Any]], count: int) -> None:
    ids = [r["custom_id"] for r in results]
    assert sorted(ids) == sorted(f"item-{i}" for i in range(count))
    assert [r["line"] for r in results] == sorted(r["line"] for r in results)  # line order


@pytest.fixture
def job_dirs(tmp_path: Path) -> dict[str, Any]:
    images = tmp_path / "images"
    images.mkdir()
    return {"job_store_dir": str(tmp_path / "jobs"), "job_sources": f"file://{images}/"}


@pytest.fixture
async def stack(redis_url: str, triton_server: TritonServer, job_dirs: dict[str, Any]
                ) -> AsyncIterator[httpx.AsyncClient]:
    settings = gateway_settings(redis_url, triton_server.grpc_url, **job_dirs)
    async with running_stack(settings, batcher_settings(redis_url,
                                                        triton_server.grpc_url)) as running:
        yield running.client


@pytest.mark.cluster
async def test_a_job_ends_with_every_item_once_and_failures_by_line(
        stack: httpx.AsyncClient) -> None:
    job = await submit(stack, manifest(text_items(300, poison_every=50)))
    assert job["status"] == "queued" and job["request_counts"]["total"] == 300
    done = await finished(stack, job["job_id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 300, "succeeded": 294, "failed": 6,
                                      "cancelled": 0, "expired": 0, "pending": 0}
    results = await lines(stack, f"/v1/jobs/{job['job_id']}/results")
    once_each(results, 300)
    failed = [r for r in results if r["status"] == "failed"]
    assert [r["line"] for r in failed] == [1, 51, 101, 151, 201, 251]
    assert all(r["error"]["code"] == "inference_failed" for r in failed)
    ok = next(r for r in results if r["custom_id"] == "item-1")
    assert ok["output"]["OUTPUT"]["length"] == len(b"text 1")
    output = await lines(stack, f"/v1/jobs/{job['job_id']}/results", file="output")
    assert len(output) == 294 and all(r["status"] == "succeeded" for r in output)
    again = await submit(stack, manifest(text_items(300, poison_every=50)))  # the same inputs
    assert (await finished(stack, again["job_id"]))["request_counts"]["succeeded"] == 294
    rerun = await lines(stack, f"/v1/jobs/{again['job_id']}/results", file="output")
    assert all(r.get("cache") == "hit" for r in rerun)  # answered by the result cache


async def test_a_bad_manifest_is_refused_line_by_line_and_nothing_is_queued(
        stack: httpx.AsyncClient, redis_url: str) -> None:
    body = b"\n".join([
        b'{"custom_id": "a", "input": "fine"}',
        b'{"custom_id": "a", "input": "again"}',
        b'not json',
        b'{"custom_id": "c", "input_base64": "%%%"}',
        b'{"custom_id": "d", "input": "x", "colour": "red"}',
        b'{"custom_id": "e", "uri": "file:///etc/passwd"}',
        b'{"input": "no id"}',
        b'',
        b'{"custom_id": "f", "input": "x", "input_base64": "eA=="}',
    ]) + b"\n"
    response = await stack.post("/v1/jobs", content=body, headers=NDJSON, params={"model": "sim"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_manifest" and error["invalid_lines"] == 8
    assert [(p["line"], p["code"]) for p in error["lines"]] == [
        (2, "duplicate_custom_id"), (3, "malformed_json"), (4, "invalid_base64"),
        (5, "unknown_field"), (6, "disallowed_uri"), (7, "missing_custom_id"),
        (8, "empty_line"), (9, "ambiguous_input")]
    wrong_type = await stack.post("/v1/jobs", content=body, params={"model": "sim"},
                                  headers={"Content-Type": "application/json"})
    assert wrong_type.status_code == 415
    unknown = await stack.post("/v1/jobs", content=manifest(text_items(2)), headers=NDJSON,
                               params={"model": "no-such-model"})
    assert unknown.status_code == 404, unknown.text
    client = redis.Redis.from_url(redis_url)
    assert stream_lengths(client) == 0 and task_keys(client) == []
    assert client.scard(keys.JOBS_ACTIVE) == 0


async def test_a_cancelled_job_keeps_what_it_has_and_ends_every_other_item_cancelled(
        stack: httpx.AsyncClient) -> None:
    job = await submit(stack, manifest(text_items(3000)))
    for _ in range(100):
        doc = (await stack.get(f"/v1/jobs/{job['job_id']}")).json()
        if doc["request_counts"]["succeeded"] >= 100:
            break
        await asyncio.sleep(0.05)
    cancel = await stack.delete(f"/v1/jobs/{job['job_id']}")
    assert cancel.status_code == 202 and cancel.json()["status"] in ("cancelling", "cancelled")
    done = await finished(stack, job["job_id"])
    counts = done["request_counts"]
    assert done["status"] == "cancelled" and counts["pending"] == 0
    assert counts["succeeded"] >= 100 and counts["cancelled"] > 0
    assert counts["succeeded"] + counts["cancelled"] == 3000
    results = await lines(stack, f"/v1/jobs/{job['job_id']}/results")
    once_each(results, 3000)
    again = await stack.delete(f"/v1/jobs/{job['job_id']}")
    assert again.status_code == 409


async def test_a_retry_runs_only_the_failed_items_again(
        stack: httpx.AsyncClient, job_dirs: dict[str, Any]) -> None:
    images = Path(job_dirs["job_sources"].removeprefix("file://"))
    for i in range(0, 10, 2):
        (images / f"{i}.bin").write_bytes(b"bytes %d" % i)
    items = [{"custom_id": f"item-{i}", "uri": f"file://{images}/{i}.bin"} for i in range(10)]
    job = await submit(stack, manifest(items))
    done = await finished(stack, job["job_id"])
    assert done["status"] == "completed" and done["request_counts"]["failed"] == 5
    first = await lines(stack, f"/v1/jobs/{job['job_id']}/results", file="errors")
    assert {r["error"]["code"] for r in first} == {"missing_object"}
    for i in range(1, 10, 2):
        (images / f"{i}.bin").write_bytes(b"bytes %d" % i)
    retry = await stack.post(f"/v1/jobs/{job['job_id']}/retry")
    assert retry.status_code == 202 and retry.json()["status"] == "queued", retry.text
    done = await finished(stack, job["job_id"])
    assert done["status"] == "completed" and done["attempts"] == 2
    assert done["request_counts"]["succeeded"] == 10, done
    results = await lines(stack, f"/v1/jobs/{job['job_id']}/results")
    once_each(results, 10)
    assert all(r["status"] == "succeeded" for r in results)
    nothing = await stack.post(f"/v1/jobs/{job['job_id']}/retry")
    assert nothing.status_code == 409


async def progress(client: httpx.AsyncClient, job_id: str, succeeded: int) -> None:
    for _ in range(300):
        doc = await job_record(client, job_id)
        if doc and doc["request_counts"]["succeeded"] >= succeeded:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} made no progress: {doc}")


async def test_a_job_whose_gateway_is_killed_is_resumed_by_another_with_every_item_once(
        redis_url: str, triton_server: TritonServer, job_dirs: dict[str, Any]) -> None:
    settings = gateway_settings(redis_url, triton_server.grpc_url, job_lease_s=2.0, workers=1,
                                **job_dirs)
    batcher = Batcher.from_settings(batcher_settings(redis_url, triton_server.grpc_url))
    await batcher.start()
    proc = subprocess.Popen([sys.executable, "-m", "ferry", "gateway"],
                            env={**os.environ, **to_env(settings, GatewaySettings)})
    try:
        url = f"http://127.0.0.1:{settings.port}"
        assert await wait_until(lambda: http_ok(f"{url}/readyz"), 60)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            job = await submit(client, manifest(text_items(10_000)))
            await progress(client, job["job_id"], 1000)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        async with running_gateway(settings) as client:
            killed = (await client.get(f"/v1/jobs/{job['job_id']}")).json()
            assert killed["status"] == "running" and killed["request_counts"]["pending"] > 0
            done = await finished(client, job["job_id"], timeout_s=120)
            assert done["status"] == "completed", done
            assert done["request_counts"]["succeeded"] == 10_000
            once_each(await lines(client, f"/v1/jobs/{job['job_id']}/results"), 10_000)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        await batcher.stop()


async def test_ferry_jobs_submits_a_directory_follows_it_and_resumes_without_resubmitting(
        redis_url: str, triton_server: TritonServer, job_dirs: dict[str, Any],
        tmp_path: Path) -> None:
    settings = gateway_settings(redis_url, triton_server.grpc_url, **job_dirs)
    photos = tmp_path / "photos"
    (photos / "sub").mkdir(parents=True)
    for i in range(40):
        (photos / ("sub" if i % 2 else "") / f"{i}.bin").write_bytes(b"photo %d" % i)
    (photos / ".hidden").write_bytes(b"skipped")
    out = tmp_path / "results.jsonl"
    batcher = Batcher.from_settings(batcher_settings(redis_url, triton_server.grpc_url))
    await batcher.start()
    try:
        async with serving(settings) as served:
            base = ["jobs", "--url", served.http]
            code = await asyncio.to_thread(
                cli.main, [*base, "submit", str(photos), "--model", "sim", "--out", str(out)])
            assert code == 0
            results = [orjson.loads(line) for line in out.read_bytes().splitlines()]
            assert sorted(r["custom_id"] for r in results) == sorted(
                str(p.relative_to(photos)) for p in photos.rglob("*.bin"))
            assert all(r["status"] == "succeeded" for r in results)
            assert not out.with_name("results.jsonl.job").exists()
            # A submit whose answer was lost: the key is remembered, the job exists.
            manifest_file = tmp_path / "m.jsonl"
            manifest_file.write_bytes(manifest(text_items(5)))
            async with httpx.AsyncClient(base_url=served.http) as client:
                first = await client.post("/v1/jobs", content=manifest_file.read_bytes(),
                                          params={"model": "sim"},
                                          headers={**NDJSON, "Idempotency-Key": "k-1"})
                assert first.status_code == 202
                again = tmp_path / "again.jsonl"
                again.with_name("again.jsonl.job").write_text("k-1\n")
                code = await asyncio.to_thread(cli.main, [
                    *base, "submit", str(manifest_file), "--model", "sim", "--out", str(again)])
                assert code == 0 and len(again.read_bytes().splitlines()) == 5
                listed = (await client.get("/v1/jobs")).json()["data"]
                assert len(listed) == 2  # the directory's job, and k-1's: not a third
            bad = tmp_path / "bad.jsonl"
            bad.write_bytes(b'{"custom_id": "a"}\n')
            code = await asyncio.to_thread(cli.main, [
                *base, "submit", str(bad), "--model", "sim", "--out", str(tmp_path / "x")])
            assert code == 1
    finally:
        await batcher.stop()


async def test_a_job_whose_window_closes_expires_keeping_what_it_has(
        stack: httpx.AsyncClient) -> None:
    job = await submit(stack, manifest(text_items(10_000)), completion_window="2s")
    done = await finished(stack, job["job_id"], timeout_s=60)
    counts = done["request_counts"]
    assert done["status"] == "expired" and counts["pending"] == 0, done
    assert counts["succeeded"] > 0 and counts["expired"] > 0
    assert counts["succeeded"] + counts["expired"] == 10_000
    results = await lines(stack, f"/v1/jobs/{job['job_id']}/results")
    once_each(results, 10_000)
    assert {r["error"]["code"] for r in results if r["status"] == "expired"} == {"expired"}


async def test_a_clients_jobs_are_bounded_in_number_and_items(
        redis_url: str, triton_server: TritonServer, job_dirs: dict[str, Any]) -> None:
    settings = gateway_settings(redis_url, triton_server.grpc_url, job_max_unfinished=2,
                                job_max_items_per_client=25, jobs=False, **job_dirs)
    async with running_gateway(settings) as client:  # no runner: jobs stay queued
        await submit(client, manifest(text_items(10)))
        too_many_items = await client.post("/v1/jobs", content=manifest(text_items(20)),
                                           headers=NDJSON, params={"model": "sim"})
        assert too_many_items.status_code == 429
        assert too_many_items.json()["error"]["code"] == "too_many_items"
        await submit(client, manifest(text_items(15)))
        too_many_jobs = await client.post("/v1/jobs", content=manifest(text_items(1)),
                                          headers=NDJSON, params={"model": "sim"})
        assert too_many_jobs.status_code == 429, too_many_jobs.text
        assert too_many_jobs.json()["error"]["code"] == "too_many_jobs"
        assert "Retry-After" in too_many_jobs.headers
