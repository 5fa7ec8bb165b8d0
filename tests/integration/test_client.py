"""``ferry.client`` against a real gateway on a loopback port, with a real batcher, Redis and
Triton: the sync and async clients agree; a task is submitted, followed and cancelled; a
connection that drops every third time and a storm of 429s lose nothing and run nothing twice;
a job's results are followed and resumed from a cursor."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from ferry.auth import api_keys
from ferry.client import AsyncClient, Client, RetryPolicy, TaskStatus
from ferry.client.errors import AlreadyFinishedError, UnknownTaskError
from ferry.settings import GatewaySettings
from ferry.stack.ports import LOOPBACK
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    gateway_settings,
    running_batchers,
    serving,
    task_keys,
)

pytestmark = pytest.mark.integration

QUICK = RetryPolicy(attempts=30, deadline_s=30, base_delay_s=0.05, max_delay_s=0.5)


def sim_output(text: str) -> dict[str, Any]:
    return {"OUTPUT": {"length": len(text.encode()),
                       "sha256": hashlib.sha256(text.encode()).hexdigest()}}


@asynccontextmanager
async def ferry(settings: GatewaySettings, triton_url: str, batcher: bool = True
                ) -> AsyncIterator[str]:
    """A gateway on a real port (and a batcher, unless not): its URL."""
    batchers = [batcher_settings(settings.redis_url, triton_url)] if batcher else []
    async with serving(settings) as served, running_batchers(*batchers):
        yield served.http


def in_thread_client(url: str, **options: Any) -> Client:
    return Client(url, retry=QUICK, **options)


async def test_the_sync_and_async_clients_give_the_same_answers(
        redis_url: str, triton_server: TritonServer) -> None:
    url = triton_server.grpc_url
    async with ferry(gateway_settings(redis_url, url), url) as gateway, \
            AsyncClient(gateway, retry=QUICK) as aio:
        tensors = [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}]

        def sync_answers() -> list[Any]:
            with in_thread_client(gateway) as client:
                return [client.infer("sim", "hello", timeout=20),
                        client.infer("sim", b"bytes", priority="high"),
                        client.infer("sim", tensors=tensors)]

        sync = await asyncio.to_thread(sync_answers)
        aio_answers = [await aio.infer("sim", "hello", timeout=20),
                       await aio.infer("sim", b"bytes", priority="high"),
                       await aio.infer("sim", tensors=tensors)]
    for one, other in zip(sync, aio_answers, strict=True):
        assert one.status is other.status is TaskStatus.SUCCESS
        assert one.output == other.output
        assert one.model == other.model == "sim" and one.model_version == other.model_version
        assert one.task_id != other.task_id and one.finished_at is not None
    assert sync[0].output == sim_output("hello") and sync[0].deadline_at is not None
    assert sync[1].output == sim_output("bytes") and sync[1].priority == "high"
    assert sync[2].output["outputs"][0]["name"] == "OUTPUT"


async def test_a_submitted_task_is_followed_and_cancelled(
        redis_url: str, triton_server: TritonServer) -> None:
    """No batcher at first: the task waits, is cancelled (a repeat answers the same), and
    its result says so; with a batcher, a finished task cannot be cancelled."""
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url)
    async with ferry(settings, url, batcher=False) as gateway, \
            AsyncClient(gateway, retry=QUICK) as client:
        task = await client.submit("sim", "wait for me")
        assert (await task.status()).status is TaskStatus.PENDING
        cancelled = await task.cancel()
        assert cancelled.status is TaskStatus.CANCELLED and cancelled.task_id == task.task_id
        assert (await task.cancel()).status is TaskStatus.CANCELLED
        assert (await task.result(wait=5)).status is TaskStatus.CANCELLED
        with pytest.raises(UnknownTaskError) as unknown:
            await client.status("0" * 32)
        assert unknown.value.status == 404 and unknown.value.code == "unknown_task"
        async with running_batchers(batcher_settings(redis_url, url)):
            done = await client.submit("sim", "finish me")
            assert (await done.result(wait=20)).output == sim_output("finish me")
            with pytest.raises(AlreadyFinishedError) as late:
                await done.cancel()
    assert late.value.status == 409


class DroppingProxy:
    """A TCP proxy to the gateway that, on every third connection, passes the request on and
    then closes the connection without its answer: the gateway did the work, the client
    never heard."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.connections = itertools.count(1)
        self.dropped = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, LOOPBACK, 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://{LOOPBACK}:{port}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        drop = next(self.connections) % 3 == 0
        up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        forward = asyncio.ensure_future(self.pipe(reader, up_writer))
        try:
            if drop:
                await up_reader.read(1)  # the gateway answered: it has done the work
                self.dropped += 1
            else:
                await self.pipe(up_reader, writer)
        finally:
            forward.cancel()
            for each in (writer, up_writer):
                each.close()

    @staticmethod
    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy until the source ends, then close the sink (each side's end reaches the
        other)."""
        try:
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()


async def test_a_connection_dropped_every_third_time_loses_nothing_and_runs_nothing_twice(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url)
    proxy = DroppingProxy(settings.port)
    # No kept-alive connections: each request opens one, so every third is dropped.
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with ferry(settings, url) as _:
        address = await proxy.start()
        try:
            async with AsyncClient(address, retry=QUICK,
                                   transport=httpx.AsyncHTTPTransport(limits=fresh)) as aio:
                answers = [await aio.infer("sim", f"flaky {i}") for i in range(8)]

            def sync_answers() -> list[Any]:
                with Client(address, retry=QUICK,
                            transport=httpx.HTTPTransport(limits=fresh)) as client:
                    return [client.infer("sim", f"flaky sync {i}") for i in range(8)]

            answers += await asyncio.to_thread(sync_answers)
        finally:
            await proxy.stop()
    assert proxy.dropped >= 4  # the test saw lost answers
    texts = [f"flaky {i}" for i in range(8)] + [f"flaky sync {i}" for i in range(8)]
    assert [a.output for a in answers] == [sim_output(t) for t in texts]
    assert len({a.task_id for a in answers}) == 16
    assert len(task_keys(redis_client)) == 16  # one task per request: no retry ran twice


class Counting(httpx.AsyncBaseTransport):
    """A transport that counts the answers' statuses (and the idempotency keys sent)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.statuses: Counter[int] = Counter()
        self.keys: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.statuses[response.status_code] += 1
        if request.method == "POST":
            self.keys[request.headers["idempotency-key"]] += 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_storm_of_429s_is_retried_through_and_nothing_runs_twice(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    """A client allowed 20 requests a second (bursts of 20) sends 40 at once: it is refused
    with 429 and Retry-After, retries with the same keys, and every request ends with one
    task."""
    key = api_keys.new_key()
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url, auth="api_key",
                                api_keys=api_keys.config_line("storm", key),
                                rate_limit_per_min=1200, rate_limit_burst=20)
    counting = Counting()
    async with ferry(settings, url) as gateway, \
            AsyncClient(gateway, api_key=key, retry=QUICK, transport=counting) as client:
        tasks = await asyncio.gather(*(client.submit("sim", f"storm {i}") for i in range(40)))
        results = [await task.result(wait=30) for task in tasks]
    assert counting.statuses[429] > 0  # a storm there was
    assert len(counting.keys) == 40 and max(counting.keys.values()) > 1  # retried, same key
    assert [r.output for r in results] == [sim_output(f"storm {i}") for i in range(40)]
    assert len({r.task_id for r in results}) == 40
    assert len(task_keys(redis_client)) == 40


def manifest_file(path: Path, count: int) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"custom_id": f"item-{i}", "input": f"job {i}"})
                              + b"\n" for i in range(count)))
    return path


def first(lines: Iterator[Any], count: int) -> list[Any]:
    return list(itertools.islice(lines, count))


async def test_a_job_is_followed_and_its_results_resumed_from_a_cursor(
        redis_url: str, triton_server: TritonServer, tmp_path: Path) -> None:
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url, job_store_dir=str(tmp_path / "jobs"))
    async with ferry(settings, url) as gateway, AsyncClient(gateway, retry=QUICK) as aio:

        def submit_and_read_some() -> tuple[str, list[Any], str]:
            with in_thread_client(gateway) as client:
                job = client.submit_job(manifest_file(tmp_path / "m.jsonl", 30), model="sim")
                assert job.counts.total == 30
                results = client.job_results(job.job_id)
                return job.job_id, first(results, 7), results.cursor

        job_id, head, cursor = await asyncio.to_thread(submit_and_read_some)
        tail = [line async for line in aio.job_results(job_id, after=cursor)]
        seen: list[int] = []
        record = await aio.wait_job(job_id, on_progress=lambda r: seen.append(r.counts.done))
        again = [line async for line in aio.job_results(job_id, after=cursor)]
        ordered = await aio.final_results(job_id)
        items = await aio.submit_job(({"custom_id": f"x{i}", "input": str(i)} for i in range(3)),
                                     model="sim", idempotency_key="the-same-job")
        repeat = await aio.submit_job([{"custom_id": "other", "input": "ignored"}],
                                      model="sim", idempotency_key="the-same-job")
    assert record.status.value == "completed" and record.counts.succeeded == 30
    assert seen[-1] == 30
    followed = [line.custom_id for line in head + tail]
    assert sorted(followed) == sorted(f"item-{i}" for i in range(30))  # each once
    assert [line.custom_id for line in again] == followed[7:]  # the cursor resumes there
    assert [line.line for line in ordered] == list(range(1, 31))
    assert all(line.output == sim_output(f"job {line.line - 1}") for line in ordered)
    assert repeat.job_id == items.job_id and items.counts.total == 3


ROOT = Path(__file__).resolve().parents[2]


def doc_examples() -> list[str]:
    """docs/client.md's Python blocks, and the README's that use the client."""
    pages = (ROOT / "docs" / "client.md", ROOT / "README.md")
    blocks = [block.split("```", 1)[0] for page in pages
              for block in page.read_text().split("```python\n")[1:]]
    return [block for block in blocks if "ferry.client" in block]


async def test_the_examples_of_docs_client_md_run_as_written(
        redis_url: str, triton_server: TritonServer, tmp_path: Path) -> None:
    """Every Python block of docs/client.md (and the README's one), pointed at this gateway
    instead of ``make up``'s (the one change), runs to its end."""
    url = triton_server.grpc_url
    examples = doc_examples()
    assert len(examples) >= 6
    async with ferry(gateway_settings(redis_url, url, job_store_dir=str(tmp_path / "jobs")
                                      ), url) as gateway:
        for example in examples:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", example.replace("http://127.0.0.1:8000", gateway),
                cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            output, _ = await process.communicate()
            assert process.returncode == 0, f"{example}\n{output.decode()}"
