"""End to end through real Redis and real Triton: batches form, every answer is the right one."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest
import redis

from ferry import keys
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    executions_since,
    gateway_settings,
    running_gateway,
    running_stack,
    stream_lengths,
    wait_until,
)

pytestmark = [pytest.mark.integration]  # the batching policy; its Redis parts run on a cluster too


def expected_output(payload: bytes) -> dict[str, object]:
    return {"OUTPUT": {"sha256": hashlib.sha256(payload).hexdigest(), "length": len(payload)}}


async def test_hundreds_of_concurrent_requests_all_succeed_with_their_own_answer(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        payloads = [f"request-{i}-{'x' * (i % 17)}".encode() for i in range(400)]
        task_ids = await asyncio.gather(*(stack.submit(p) for p in payloads))
        results = await stack.results(task_ids)
    assert [r["status"] for r in results] == ["SUCCESS"] * len(payloads)
    for payload, task_id, result in zip(payloads, task_ids, results, strict=True):
        assert result["task_id"] == task_id
        assert result["output"] == expected_output(payload)
    executed = executions_since(before, batch_executions(url, "sim"))
    assert sum(size * n for size, n in executed.items()) == len(payloads)
    assert max(executed) > 1, f"no batch formed: {executed}"
    assert sum(executed.values()) < len(payloads) / 2, f"batches too small: {executed}"
    assert stream_lengths(redis_client) == 0  # every entry acknowledged and deleted
    pending = redis_client.xpending(keys.partition_stream(0), keys.CONSUMER_GROUP)
    assert pending["pending"] == 0


async def test_sixty_four_simultaneous_requests_leave_as_one_batch(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    classic = batcher_settings(redis_url, url, max_wait_ms=3000, adaptive_flush=False)
    async with running_stack(gateway_settings(redis_url, url), classic) as stack:
        started = time.monotonic()
        task_ids = await asyncio.gather(*(stack.submit(f"s{i}") for i in range(64)))
        results = await stack.results(task_ids)
        elapsed = time.monotonic() - started
    assert all(r["status"] == "SUCCESS" for r in results)
    assert executions_since(before, batch_executions(url, "sim")) == {64: 1}
    assert elapsed < 3.0, "a full batch must leave at once, not at its departure time"


async def test_a_free_slot_takes_everything_queued_not_one_read_of_it(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """60 tasks wait in 16 streams when the batcher starts: a read takes 4 per stream, so one
    read brings only part of them, yet the batch that leaves (a slot is free, nobody else is
    coming) holds all 60: the reader reads on while a stream gave all it was asked for."""
    url = triton_server.grpc_url
    gateway = gateway_settings(redis_url, url)
    async with running_gateway(gateway) as client:
        task_ids = [(await client.post("/v1/inference?model=sim", content=f"queued-{i}".encode(),
                                       headers={"Content-Type": "application/octet-stream"})
                     ).json()["task_id"] for i in range(60)]
    before = batch_executions(url, "sim")
    async with running_stack(gateway, batcher_settings(redis_url, url)) as stack:
        assert stack.batchers[0]._reader.per_stream == 4  # 64 over 16 streams
        results = await stack.results(task_ids)
    assert all(r["status"] == "SUCCESS" for r in results)
    assert executions_since(before, batch_executions(url, "sim")) == {60: 1}


async def test_without_adaptive_flush_a_lone_request_leaves_after_the_wait(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    classic = batcher_settings(redis_url, url, max_wait_ms=400, adaptive_flush=False)
    async with running_stack(gateway_settings(redis_url, url), classic) as stack:
        started = time.monotonic()
        result = await stack.result(await stack.submit("alone"))
        elapsed = time.monotonic() - started
    assert result["status"] == "SUCCESS"
    assert elapsed >= 0.4, "it left before its departure time"
    assert elapsed < 10
    assert executions_since(before, batch_executions(url, "sim")) == {1: 1}


async def test_with_an_slo_a_batch_leaves_in_time_for_it_not_at_max_wait(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """Max wait 3 s, adaptive flush off: the SLO (600 ms) alone sends the lone request, about
    90 ms (15% of the SLO) before its due time (no call was timed yet: t(B) unknown)."""
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    settings = batcher_settings(redis_url, url, max_wait_ms=3000, adaptive_flush=False,
                                slo_ms=600)
    async with running_stack(gateway_settings(redis_url, url), settings) as stack:
        started = time.monotonic()
        result = await stack.result(await stack.submit("in time"))
        elapsed = time.monotonic() - started
        metrics = stack.batchers[0].metrics.flushes.labels("sim", "deadline")._value.get()
    assert result["status"] == "SUCCESS"
    assert 0.45 <= elapsed < 1.5, f"answered after {elapsed:.3f} s"
    assert metrics == 1
    assert executions_since(before, batch_executions(url, "sim")) == {1: 1}


async def test_a_request_deadline_shorter_than_max_wait_is_served_not_expired(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """A 700 ms deadline with a 3 s max wait: the batch leaves before the deadline, and the task
    succeeds (it used to wait the 3 s and expire)."""
    url = triton_server.grpc_url
    settings = batcher_settings(redis_url, url, max_wait_ms=3000, adaptive_flush=False)
    async with running_stack(gateway_settings(redis_url, url), settings) as stack:
        started = time.monotonic()
        response = await stack.client.post("/v1/inference?model=sim", content=b"hurry",
                                           headers={"Content-Type": "text/plain",
                                                    "X-Request-Timeout": "0.7"})
        assert response.status_code == 202, response.text
        result = await stack.result(str(response.json()["task_id"]))
        elapsed = time.monotonic() - started
    assert result["status"] == "SUCCESS", result
    assert elapsed < 1.0


async def test_batches_form_across_partitions_and_respect_max_batch(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """Tasks spread over 16 streams still fill batches; none exceeds FERRY_MAX_BATCH."""
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_batch=8, max_wait_ms=2000,
                                              adaptive_flush=False)) as stack:
        task_ids = await asyncio.gather(*(stack.submit(f"p{i}") for i in range(40)))
        results = await stack.results(task_ids)
        registry = stack.batchers[0].metrics.registry
    assert all(r["status"] == "SUCCESS" for r in results)
    assert executions_since(before, batch_executions(url, "sim")) == {8: 5}
    # One instance, five full batches: after a call ends with tasks boarded, the time to the next
    # batch is measured (at most once per call that is followed by another batch).
    gaps = registry.get_sample_value("ferry_dispatch_gap_seconds_count", {"model": "sim"})
    assert gaps is not None and 1 <= gaps <= 4


async def test_models_are_batched_separately(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=20)) as stack:
        sim_ids = [await stack.submit(f"m{i}") for i in range(5)]
        image = await stack.submit(_png(), model="moderation", content_type="image/png")
        results = await stack.results([*sim_ids, image])
    assert all(r["status"] == "SUCCESS" for r in results), results
    assert [r["model"] for r in results] == ["sim"] * 5 + ["moderation"]
    assert results[-1]["output"]["DETECTIONS"]["detections"] == []


@pytest.mark.single_redis  # a Redis of its own, or counts one server's commands
async def test_long_poll_returns_when_the_result_is_written(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url)) as stack:
        task_id = await stack.submit("waiting")
        # No batcher yet: the poll waits, and does not poll Redis while it waits.
        reads_before = _record_reads(redis_client)
        started = time.monotonic()
        pending = await stack.result(task_id, wait=1.0)
        assert pending["status"] == "PENDING"
        assert time.monotonic() - started >= 1.0
        assert _record_reads(redis_client) - reads_before == 1  # one read, then it waits
        reads_before = _record_reads(redis_client)
        poll = asyncio.create_task(stack.result(task_id, wait=25))
        assert await wait_until(lambda: _record_reads(redis_client) > reads_before, 5)
        assert not poll.done()  # it has read the record, and waits
        batcher_started = time.monotonic()
        from ferry.batcher.worker import Batcher

        batcher = Batcher.from_settings(batcher_settings(redis_url, url, max_wait_ms=10))
        await batcher.start()
        try:
            result = await poll
            returned_after = time.monotonic() - batcher_started
        finally:
            await batcher.stop()
    assert result["status"] == "SUCCESS"
    assert returned_after < 5, "the long poll did not return when the result was written"


@pytest.mark.cluster
async def test_result_expires_after_its_ttl(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url, result_ttl_s=1),
                             batcher_settings(redis_url, url, result_ttl_s=1,
                                              max_wait_ms=5)) as stack:
        task_id = await stack.submit("short-lived")
        assert (await stack.result(task_id))["status"] == "SUCCESS"
        await asyncio.sleep(2.2)  # past the 1 s TTL: time itself must pass
        response = await stack.client.get(f"/v1/result/{task_id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_task"


async def test_stop_sends_what_has_boarded(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """Two-phase stop: tasks waiting for their departure time leave at once, none is stranded."""
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=60_000,
                                              adaptive_flush=False)) as stack:
        task_ids = [await stack.submit(f"boarded-{i}") for i in range(10)]
        batcher = stack.batchers[0]
        assert await _eventually(lambda: batcher.buffered == 10)
        started = time.monotonic()
        await batcher.stop()
        assert time.monotonic() - started < 5
        results = await stack.results(task_ids, wait=5)
    assert [r["status"] for r in results] == ["SUCCESS"] * 10
    assert stream_lengths(redis_client) == 0


def _record_reads(client: redis.Redis) -> int:
    """How often task records were read (the gateway reads them with HMGET)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in ("hmget", "hget", "hgetall"))


def _png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 200, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


async def _eventually(predicate: object, timeout_s: float = 5.0) -> bool:
    from tests.integration.helpers import wait_until

    return await wait_until(predicate, timeout_s)
