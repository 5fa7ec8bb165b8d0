"""The inference log against real servers: the hand-off script keeps each model's stream to its
bound and counts what it drops; the logger writes rotated files to a directory and to an
S3-compatible server (moto's), and CloudEvents to a collector on loopback, acknowledging only
what the sink holds, through a collector that is down for a while; ``ferry log tail``; and,
through a gateway, a batcher and Triton, the share of 2,000 tasks logged and requests that a
sink that is down does not touch."""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import redis
import uvicorn

from ferry import keys
from ferry.codec import encode_task
from ferry.inference_log.cli import add_parser
from ferry.inference_log.cli import run as tail
from ferry.inference_log.handoff import HandOff
from ferry.inference_log.logger import Logger
from ferry.inference_log.record import Shaping, sampled
from ferry.inference_log.sinks import EventSink, FileSink, Rotation, Sink
from ferry.jobs.blobs import BlobStore, DirectoryStore, ObjectStore
from ferry.queue.base import Delivery
from ferry.redis_conn import lean
from ferry.resp.client import RedisAddress, RespClient
from ferry.settings.services import LoggerSettings
from ferry.stack.ports import LOOPBACK, free_port
from ferry.tasks.base import Completion
from ferry.tasks.record import Status, TaskRecord
from ferry.telemetry.metrics import BatcherMetrics, LoggerMetrics
from ferry.v1.task_pb2 import Task
from tests.conftest import REDIS_CLUSTER, S3Server, TritonServer
from tests.integration.helpers import (
    Stack,
    batcher_settings,
    gateway_settings,
    running_stack,
    wait_until,
)

pytestmark = pytest.mark.integration


def completions(n: int, model: str = "sim") -> list[Completion]:
    """``n`` finished tasks of ``model``, as a batch's completion hands them over."""
    found = []
    for i in range(n):
        task = Task(task_id=secrets.token_hex(16), model=model, payload=f"in-{i}".encode(),
                    content_type="text/plain", enqueued_at_ms=1_764_300_000_000)
        final = TaskRecord.final(task, Status.SUCCESS, 1_764_300_000.5, output={"n": i})
        delivery = Delivery(0, keys.partition_stream(0), f"{i + 1}-0", encode_task(task), task)
        found.append(Completion(delivery, final, rows=1))
    return found


def settings(redis_url: str, **values: Any) -> LoggerSettings:
    return LoggerSettings(redis_url=redis_url, redis_cluster=REDIS_CLUSTER, **values)


def hand_off(redis_url: str, *, max_records: int = 1000, metrics: BatcherMetrics | None = None,
             queue_bytes: int = 1 << 20) -> HandOff:
    return HandOff(lean(settings(redis_url), "test-handoff"), {"sim": 1.0, "other": 1.0},
                   Shaping(), max_records=max_records, metrics=metrics or BatcherMetrics(),
                   queue_bytes=queue_bytes)


async def handed(log: HandOff, batch: Sequence[Completion]) -> None:
    """Offer a batch and wait for its hand-off to end."""
    log.offer(batch, [True] * len(batch))
    await log.close(timeout_s=30)


def counted(counter: Any, *labels: str) -> float:
    return float((counter.labels(*labels) if labels else counter)._value.get())


def raw_records(client: redis.Redis, model: str = "sim", part: str = "stream") -> list[bytes]:
    """The records in one of a model's log keys (its stream, or the ``recent`` ring)."""
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                   client.xrange(keys.log_key(model, part)))
    return [fields[keys.LOG_FIELD.encode()] for _, fields in entries]


def logged_ids(client: redis.Redis, model: str = "sim", part: str = "stream") -> list[str]:
    return [orjson.loads(record)["id"] for record in raw_records(client, model, part)]


# --- the hand-off -----------------------------------------------------------------------------


@pytest.mark.cluster
async def test_the_hand_off_keeps_the_bound_and_counts_what_it_drops(
        redis_url: str, redis_client: redis.Redis) -> None:
    metrics = BatcherMetrics()
    log = hand_off(redis_url, max_records=5, metrics=metrics)
    first, second = completions(3), completions(5)
    await handed(log, first)
    await handed(log, second + completions(2, "other"))
    kept = [c.delivery.task.task_id for c in (first + second)[:5] if c.delivery.task]
    assert logged_ids(redis_client) == kept  # in order, up to the bound
    assert logged_ids(redis_client, part="recent") == kept  # tail shows what the log took
    assert redis_client.get(keys.log_key("sim", "dropped")) == b"3"
    assert counted(metrics.log_dropped, "sim", "full") == 3
    assert counted(metrics.log_records, "sim") == 5
    assert len(logged_ids(redis_client, "other")) == 2  # its own stream, its own bound
    await log.redis.close()


async def test_only_written_sampled_tasks_go_and_a_full_queue_or_redis_error_drops(
        redis_url: str, redis_client: redis.Redis) -> None:
    metrics = BatcherMetrics()
    batch = completions(4)
    weight = len(batch[0].delivery.raw) + 512
    log = hand_off(redis_url, metrics=metrics, queue_bytes=2 * weight)
    log.offer(batch[:2], [True, False])  # a duplicate delivery's record was not written
    log.offer(batch[2:3], [True])  # queued behind it: 2 records' weight
    log.offer(batch[3:], [True])  # past the queue's bound: dropped, not held
    await log.close(timeout_s=30)
    assert [c.delivery.task.task_id for c in (batch[0], batch[2]) if c.delivery.task] == \
        logged_ids(redis_client)
    assert counted(metrics.log_dropped, "sim", "busy") == 1
    down = RespClient(RedisAddress.from_url(f"redis://{LOOPBACK}:{free_port()}/0"),
                      timeout_s=2, connect_timeout_s=2)
    broken = HandOff(down, {"sim": 1.0}, Shaping(), max_records=10, metrics=metrics)
    await handed(broken, completions(2))  # nothing raised: counted and logged
    assert counted(metrics.log_dropped, "sim", "error") == 2
    await log.redis.close()
    await down.close()


@pytest.mark.cluster
async def test_ferry_log_tail_prints_the_latest_records_oldest_first(
        redis_url: str, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    if REDIS_CLUSTER:  # as its user would say it: a model's keys may be on any node
        monkeypatch.setenv("FERRY_REDIS_CLUSTER", "true")
    log = hand_off(redis_url, max_records=3)
    batch = completions(5)
    await handed(log, batch)
    await log.redis.close()
    parser = _tail_parser()
    out, err = io.StringIO(), io.StringIO()
    args = parser.parse_args(["log", "tail", "sim", "-n", "2", "--redis-url", redis_url])
    assert await asyncio.to_thread(tail, args, out, err) == 0  # it runs a loop of its own
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert [r["id"] for r in lines] == [c.delivery.task.task_id for c in batch[1:3]
                                        if c.delivery.task]
    assert "2 record(s) of sim dropped" in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    args = parser.parse_args(["log", "tail", "nope", "--redis-url", redis_url])
    assert await asyncio.to_thread(tail, args, out, err) == 0
    assert out.getvalue() == "" and err.getvalue().startswith(  # said, not silent
        f"ferry log tail: no record of 'nope' in {redis_url} (its tasks are logged where "
        "FERRY_LOG_MODELS names it")


def _tail_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry")
    add_parser(parser.add_subparsers(dest="command"))
    return parser


# --- the logger -------------------------------------------------------------------------------


@asynccontextmanager
async def logging_to(redis_url: str, sink: Sink, metrics: LoggerMetrics | None = None,
                     models: Sequence[str] = ("sim",)) -> AsyncIterator[Logger]:
    """A logger of ``models`` in this event loop, retrying a failed sink within a second."""
    s = settings(redis_url, log_models=",".join(models))
    logger = Logger(list(models), lean(s, "test-logger"), sink, metrics or LoggerMetrics(),
                    reader=None if REDIS_CLUSTER else lean(s, "test-logger-read"),
                    retry_max_s=1.0)
    await logger.start()
    try:
        yield logger
    finally:
        await logger.stop()


def stream_empty(client: redis.Redis, model: str = "sim") -> Any:
    return lambda: client.xlen(keys.log_key(model)) == 0


async def lines_in(store: BlobStore, prefix: str = "sim") -> list[dict[str, Any]]:
    found = []
    for name in await store.names(prefix):
        found += [orjson.loads(line) for _, line in await store.lines(name, 0, 10_000)]
    return found


@pytest.mark.cluster
@pytest.mark.parametrize("where", ["directory", "s3"])
async def test_the_logger_writes_rotated_files_and_acknowledges_what_they_hold(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path, where: str,
        request: pytest.FixtureRequest) -> None:
    if where == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        store: BlobStore = ObjectStore(f"s3://{s3.bucket}/{tmp_path.name}", s3.endpoint)
    else:
        store = DirectoryStore(tmp_path / "log")
    log = hand_off(redis_url)
    batch = completions(40)
    await handed(log, batch)
    await log.redis.close()
    metrics = LoggerMetrics()
    # about 10 records a file: 4 files, each committed as it fills
    sink = FileSink(store, Rotation(max_bytes=10 * len(raw_records(redis_client)[0]),
                                    max_s=3600))
    async with logging_to(redis_url, sink, metrics):
        assert await wait_until(stream_empty(redis_client), 30)
    names = await store.names("sim")
    assert len(names) == 4 and all(n.endswith(".jsonl") for n in names)
    ids = [r["id"] for r in await lines_in(store)]
    assert sorted(ids) == sorted(c.delivery.task.task_id for c in batch if c.delivery.task)
    assert counted(metrics.written, "sim") == 40
    assert redis_client.xpending(keys.log_key("sim"), keys.LOG_GROUP)["pending"] == 0


class Clock:
    def __init__(self) -> None:
        self.now = 1_764_300_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_file_is_committed_by_its_age_and_the_rest_on_stop(
        redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    store, clock = DirectoryStore(tmp_path / "log"), Clock()
    sink = FileSink(store, Rotation(max_bytes=1 << 20, max_s=60), clock)
    log = hand_off(redis_url)
    async with logging_to(redis_url, sink) as logger:
        await handed(log, completions(3))
        rounds = logger.rounds
        assert await wait_until(lambda: logger.rounds > rounds + 1, 30)  # read: in a file
        assert redis_client.xlen(keys.log_key("sim")) == 3  # not acknowledged: not committed
        clock.now += 60
        assert await wait_until(stream_empty(redis_client), 30)  # by its age
        assert len(await lines_in(store)) == 3
        await handed(log, completions(2))
        rounds = logger.rounds
        assert await wait_until(lambda: logger.rounds > rounds + 1, 30)
        assert redis_client.xlen(keys.log_key("sim")) == 2  # in the open file
    await log.redis.close()
    assert len(await lines_in(store)) == 5  # the stop committed it
    assert redis_client.xlen(keys.log_key("sim")) == 0


class Collector:
    """A CloudEvents receiver on a loopback port that can be taken down and brought back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.events: list[tuple[dict[str, str], bytes]] = []
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Future[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/events"

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.events.append((headers, body))
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def up(self) -> None:
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=LOOPBACK, port=self.port,
                                                     log_level="warning", lifespan="off",
                                                     interface="asgi3"))
        self._serving = asyncio.ensure_future(self._server.serve())
        server = self._server
        assert await wait_until(lambda: server.started, 30)

    async def down(self) -> None:
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await self._serving
            self._server = None

    def ids(self, kind: str) -> list[str]:
        return [h["ce-id"] for h, _ in self.events if h["ce-type"].endswith(kind)]


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()
    yield found
    await found.down()


@pytest.mark.cluster
async def test_a_collector_that_is_down_gets_everything_below_the_bound_once_back(
        redis_url: str, redis_client: redis.Redis, collector: Collector) -> None:
    """While the collector is down the records wait in the stream, to its bound; past it they
    are dropped and counted; once it is back, it gets every record that waited, each as its
    request and its response event."""
    batcher = BatcherMetrics()
    log = hand_off(redis_url, max_records=30, metrics=batcher)
    metrics = LoggerMetrics()
    await collector.up()
    async with logging_to(redis_url, EventSink(collector.url), metrics) as logger:
        first = completions(5)
        await handed(log, first)
        assert await wait_until(stream_empty(redis_client), 30)
        await collector.down()
        during = completions(20) + completions(20)
        await handed(log, during[:20])
        assert await wait_until(lambda: logger.failures > 0, 30)  # it tried, and failed
        await handed(log, during[20:])
        assert redis_client.xlen(keys.log_key("sim")) == 30  # the bound: 10 dropped
        assert counted(batcher.log_dropped, "sim", "full") == 10
        assert counted(metrics.failures) >= 1
        # What waits is measured while the sink is down (a failed round measured nothing).
        assert await wait_until(lambda: counted(metrics.waiting, "sim") == 30, 30)
        await collector.up()
        assert await wait_until(stream_empty(redis_client), 30)
    await log.redis.close()
    expected = [c.delivery.task.task_id for c in first + during[:30] if c.delivery.task]
    assert sorted(set(collector.ids("request"))) == sorted(expected)
    assert set(collector.ids("response")) == set(expected)
    assert counted(metrics.written, "sim") == 35
    headers, body = next(e for e in collector.events if e[0]["ce-id"] == expected[0])
    assert headers["ce-inferenceservicename"] == "sim" and orjson.loads(body) == {
        "content_type": "text/plain", "payload": "in-0"}


# --- through the whole stack ------------------------------------------------------------------


async def submit_all(stack: Stack, n: int, at_once: int = 100, over_s: float = 0.0
                     ) -> list[str]:
    """``n`` tasks of ``sim``, ``at_once`` at a time, each answered; their ids. With
    ``over_s``, the waves are paced to last that long (a load that lasts: time must pass)."""
    ids: list[str] = []
    started, waves = time.monotonic(), -(-n // at_once)
    for wave, start in enumerate(range(0, n, at_once)):
        await asyncio.sleep(max(0.0, started + wave * over_s / waves - time.monotonic()))
        some = await asyncio.gather(*(stack.submit(f"t-{i}") for i in
                                      range(start, min(n, start + at_once))))
        results = await stack.results(some)
        assert [r["status"] for r in results] == ["SUCCESS"] * len(some)
        ids += some
    return ids


async def test_the_share_of_2000_tasks_logged_is_the_rate_s(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    """Each task is logged by its own id's hash: exactly those the rate samples, and their
    count within the binomial bounds of 2,000 draws at a rate of 0.25 (5 standard deviations:
    a correct sampler fails this about once in 3.5 million runs)."""
    url, rate, n = triton_server.grpc_url, 0.25, 2000
    batcher = batcher_settings(redis_url, url, log_models=f"sim={rate}")
    async with running_stack(gateway_settings(redis_url, url), batcher) as stack:
        ids = await submit_all(stack, n)
        expected = {i for i in ids if sampled(i, rate)}
        assert await wait_until(lambda: len(logged_ids(redis_client)) >= len(expected), 30)
    assert set(logged_ids(redis_client)) == expected
    assert abs(len(expected) - n * rate) <= 5 * math.sqrt(n * rate * (1 - rate))
    record = orjson.loads(raw_records(redis_client)[0])
    assert record["status"] == "SUCCESS" and record["batch"]["tasks"] >= 1
    assert record["request"]["payload"].startswith("t-")


async def test_requests_are_untouched_while_the_sink_is_down(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
        collector: Collector) -> None:
    """The collector is down for the whole load, 30 s of it: every request is answered
    SUCCESS, the model's stream holds its bound and the batcher counts the rest as dropped;
    once the collector is back it gets what waited."""
    url, bound, n = triton_server.grpc_url, 100, 600
    batcher = batcher_settings(redis_url, url, log_models="sim=1", log_max_records=bound)
    async with running_stack(gateway_settings(redis_url, url), batcher) as stack, \
            logging_to(redis_url, EventSink(collector.url)) as logger:
        started = time.monotonic()
        ids = await submit_all(stack, n, 20, over_s=30.0)  # the collector is not up
        assert time.monotonic() - started >= 29.0 and logger.failures > 0
        metrics = stack.batchers[0].metrics
        assert await wait_until(lambda: counted(metrics.log_records, "sim") +
                                counted(metrics.log_dropped, "sim", "full") >= n, 30)
        assert await wait_until(lambda: logger.failures > 0, 30)
        assert redis_client.xlen(keys.log_key("sim")) == bound
        assert counted(metrics.log_dropped, "sim", "full") == n - bound
        await collector.up()
        assert await wait_until(stream_empty(redis_client), 30)
    written = set(collector.ids("request"))
    assert len(written) == bound and written <= set(ids)
    assert written == set(logged_ids(redis_client, part="recent"))  # what tail showed
