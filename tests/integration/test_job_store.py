"""The job store against real storage: a directory, and an S3-compatible server on loopback
(moto's), through the same interface."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from ferry.jobs.blobs import READ_CHUNK, BlobStore, DirectoryStore, ObjectStore, S3Keys
from tests.conftest import S3Server, TritonServer
from tests.integration.helpers import batcher_settings, gateway_settings, running_stack

pytestmark = pytest.mark.integration


def _store(request: pytest.FixtureRequest, tmp_path: Path, read_chunk: int) -> BlobStore:
    if request.param == "directory":
        return DirectoryStore(tmp_path / "jobs", read_chunk)
    s3: S3Server = request.getfixturevalue("s3")
    return ObjectStore(f"s3://{s3.bucket}/{tmp_path.name}", s3.endpoint, read_chunk=read_chunk)


@pytest.fixture(params=["directory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    return _store(request, tmp_path, READ_CHUNK)


@pytest.fixture(params=["directory", "s3"])
def small_reads(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    """A store that reads 64 bytes at a time: lines longer than one ranged read."""
    return _store(request, tmp_path, 64)


async def test_files_appear_whole_on_commit_and_never_on_abort(store: BlobStore) -> None:
    writer = store.writer("jobs/j/input.jsonl")
    await writer.write(b'{"a": 1}\n')
    assert not await store.exists("jobs/j/input.jsonl")
    await writer.write(b'{"b": 2}\n')
    await writer.commit()
    assert await store.exists("jobs/j/input.jsonl")
    dropped = store.writer("jobs/j/other.jsonl")
    await dropped.write(b"half")
    await dropped.abort()
    assert not await store.exists("jobs/j/other.jsonl")
    await store.put("jobs/j/segments/1.jsonl", b"x\n")
    assert await store.names("jobs/j") == ["jobs/j/input.jsonl", "jobs/j/segments/1.jsonl"]
    await store.delete(["jobs/j/segments/1.jsonl"])
    assert await store.names("jobs/j") == ["jobs/j/input.jsonl"]


async def test_lines_are_read_from_any_offset_longer_than_a_read_or_not(
        small_reads: BlobStore) -> None:
    store = small_reads
    lines = [b"short", b"x" * 300, b"", b"y" * 70, b"last"]
    await store.put("f.jsonl", b"\n".join(lines) + b"\n")
    found = await store.lines("f.jsonl", 0, 10)
    assert [line for _, line in found] == lines
    offsets = [0, *(offset for offset, _ in found)]
    for index in range(len(lines)):
        again = await store.lines("f.jsonl", offsets[index], 2)
        assert [line for _, line in again] == lines[index:index + 2]
        assert [o for o, _ in again] == offsets[index + 1:index + 3]
    assert await store.lines("f.jsonl", offsets[-1], 3) == []
    streamed = b"".join([chunk async for chunk in store.stream("f.jsonl")])
    assert streamed == b"\n".join(lines) + b"\n"


async def test_a_job_kept_in_s3_reads_s3_sources_and_writes_its_files_there(
        redis_url: str, triton_server: TritonServer, s3_server: S3Server, tmp_path: Path) -> None:
    """Credentials as settings (FERRY_S3_*), not AWS_* variables: the chart mounts them."""
    s3, keys = s3_server, S3Keys("test", "test")
    sources = ObjectStore(f"s3://{s3.bucket}/photos", s3.endpoint, keys)
    for i in range(0, 6):
        await sources.put(f"{i}.bin", b"photo %d" % i)
    settings = gateway_settings(redis_url, triton_server.grpc_url, s3_endpoint=s3.endpoint,
                                s3_access_key_id="test", s3_secret_access_key="test",
                                job_store_url=f"s3://{s3.bucket}/{tmp_path.name}",
                                job_sources=f"s3://{s3.bucket}/photos/")
    items: list[dict[str, Any]] = [
        {"custom_id": f"p{i}", "uri": f"s3://{s3.bucket}/photos/{i}.bin"} for i in range(7)]
    async with running_stack(settings, batcher_settings(redis_url,
                                                        triton_server.grpc_url)) as stack:
        job = await submit_and_finish(stack.client, items)
    assert job["status"] == "completed" and job["request_counts"]["succeeded"] == 6
    store = ObjectStore(f"s3://{s3.bucket}/{tmp_path.name}", s3.endpoint, keys)
    errors = [orjson.loads(line) async for line in lines_of(store, job["files"]["errors"])]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("p6", "missing_object")]
    output = [orjson.loads(line) async for line in lines_of(store, job["files"]["output"])]
    assert [o["output"]["OUTPUT"]["length"] for o in output] == [len(b"photo 0")] * 6


async def submit_and_finish(client: httpx.AsyncClient, items: list[dict[str, Any]]
                            ) -> dict[str, Any]:
    body = b"".join(orjson.dumps(item) + b"\n" for item in items)
    response = await client.post("/v1/jobs", content=body, params={"model": "sim"},
                                 headers={"Content-Type": "application/x-ndjson"})
    assert response.status_code == 202, response.text
    for _ in range(300):
        doc: dict[str, Any] = (await client.get(f"/v1/jobs/{response.json()['job_id']}")).json()
        if doc["status"] in ("completed", "failed"):
            return doc
        await asyncio.sleep(0.1)
    raise AssertionError(f"the job did not finish: {doc}")


async def lines_of(store: BlobStore, name: str) -> AsyncIterator[bytes]:
    data = b"".join([chunk async for chunk in store.stream(name)])
    for line in data.splitlines():
        yield line
