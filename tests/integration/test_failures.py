"""Nothing lost, nothing silent: poison requests, Triton outages and crashed batchers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from ferry import keys
from ferry.batcher.worker import Batcher
from ferry.settings import BatcherSettings, to_env
from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.triton_server import TritonPorts, start_triton
from ferry.v1.task_pb2 import Task
from tests.conftest import TritonServer, build_test_repository
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    calls_at_triton,
    dead_letters,
    executions_since,
    gateway_settings,
    known_model,
    pending_count,
    running_stack,
    stream_lengths,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


async def test_poison_request_is_dead_lettered_and_its_batch_mates_succeed(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    # No adaptive flush: an idle model would send the first task read alone, and the poison
    # with it now and then, when the one batch of 16 is what the bisection is tested on.
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=2000,
                                              adaptive_flush=False)) as stack:
        good = [f"good-{i}" for i in range(15)]
        payloads = [*good[:7], "poison-pill", *good[7:]]
        task_ids = await asyncio.gather(*(stack.submit(p) for p in payloads))
        results = await stack.results(task_ids)
        registry = stack.batchers[0].metrics.registry
    by_payload = dict(zip(payloads, results, strict=True))
    poisoned = by_payload.pop("poison-pill")
    assert poisoned["status"] == "FAILED"
    assert "poison input in batch" in poisoned["error"]
    assert "3 attempt" in poisoned["error"]
    assert all(r["status"] == "SUCCESS" for r in by_payload.values())
    # Successful infer calls carried the 15 good requests, each once; the batch of 16 was
    # halved down to the poison (16, 8, 4, 2, then the poison alone, three times).
    assert registry.get_sample_value("ferry_batch_size_sum", {"model": "sim", "version": "1"}) == 15
    failures = registry.get_sample_value("ferry_infer_failures_total",
                                         {"model": "sim", "kind": "permanent"})
    assert failures is not None and failures >= 5
    letters = dead_letters(redis_client)
    assert len(letters) == 1
    assert letters[0][b"task_id"].decode() == task_ids[payloads.index("poison-pill")]
    assert b"poison" in letters[0][b"error"]
    assert b"poison-pill" in letters[0][b"task"]  # the payload is kept for inspection
    assert stream_lengths(redis_client) == 0


async def test_undecodable_image_fails_with_the_models_reason(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """An image that slips past the gateway's check fails with the model's reason, not silently."""
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=5)) as stack:
        # Skip the gateway's check by admitting through the task store directly.
        task = Task(task_id=keys.new_task_id(), model="moderation", payload=b"not an image",
                    enqueued_at_ms=1)
        await stack.admit_directly([task])
        result = await stack.result(task.task_id)
    assert result["status"] == "FAILED"
    assert "not a decodable image" in result["error"]
    assert len(dead_letters(redis_client)) == 1


async def test_triton_unreachable_past_the_outage_budget_ends_failed(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, "127.0.0.1:9", outage_budget_s=1.0,
                                              max_wait_ms=5, infer_timeout_s=2)) as stack:
        task_id = await stack.submit("nobody home")
        started = time.monotonic()
        result = await stack.result(task_id)
        waited = time.monotonic() - started
    assert result["status"] == "FAILED"
    assert "Triton unreachable for 1 s" in result["error"] and "UNAVAILABLE" in result["error"]
    assert waited >= 1.0  # it waited for Triton rather than spend its attempts at once
    assert len(dead_letters(redis_client)) == 1
    assert stream_lengths(redis_client) == 0


@pytest.mark.single_redis  # Triton's outage, not Redis's: the cluster run would only repeat it
async def test_a_triton_restart_loses_nothing(
    redis_url: str, tmp_path: Path, redis_client: redis.Redis,
) -> None:
    """Triton goes away under load and comes back: every accepted request still succeeds, and
    the circuit breaker (set to open on any counted failure) stays closed: an outage is no
    failure of the model."""
    repository = build_test_repository(tmp_path / "models")
    ports = TritonPorts.free()
    triton, _ = start_triton(repository, tmp_path / "triton", ports=ports)
    url = f"127.0.0.1:{ports.grpc}"
    try:
        async with running_stack(gateway_settings(redis_url, url),
                                 batcher_settings(redis_url, url, max_wait_ms=10,
                                                  claim_idle_ms=1000, claim_interval_ms=200,
                                                  breaker_min_calls=1,
                                                  breaker_threshold=0.01)) as stack:
            first = await asyncio.gather(*(stack.submit(f"before-{i}") for i in range(30)))
            assert all(r["status"] == "SUCCESS" for r in await stack.results(first))
            triton.stop(grace_s=10)  # Triton is gone; the gateway still accepts (cached catalog)
            during = await asyncio.gather(*(stack.submit(f"during-{i}") for i in range(30)))
            # the batcher notices and holds the work
            assert await wait_until(lambda: not stack.batchers[0].backend_reachable, 10)
            triton, _ = start_triton(repository, tmp_path / "triton", ports=ports)
            results = await stack.results(during, wait=30)
            batcher = stack.batchers[0]
            assert known_model(batcher, "sim").breaker().state(batcher.clock()).value == "closed"
    finally:
        triton.stop(grace_s=10)
    assert [r["status"] for r in results] == ["SUCCESS"] * 30
    assert dead_letters(redis_client) == []
    assert stream_lengths(redis_client) == 0


async def test_tasks_of_a_crashed_batcher_are_reclaimed(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """A batcher process is killed with SIGKILL mid-inference; a live one finishes its tasks."""
    url = triton_server.grpc_url
    doomed = batcher_settings(redis_url, url, max_wait_ms=5, metrics_port=free_port())
    metrics = f"http://{LOOPBACK}:{doomed.metrics_port}"
    env = {**os.environ, **to_env(doomed, BatcherSettings)}
    async with running_stack(gateway_settings(redis_url, url)) as stack:
        task_ids = [await stack.submit(f"orphan-{i}", model="sim_slow") for i in range(6)]
        before = batch_executions(url, "sim_slow")
        proc = subprocess.Popen([sys.executable, "-m", "ferry", "batcher"], env=env)
        try:
            # sim_slow takes 1.5 s a batch: kill the batcher while its batch is at Triton.
            assert await wait_until(lambda: pending_count(redis_client) == 6, 20)
            assert await wait_until(lambda: calls_at_triton(metrics) == 1, 20, interval_s=0.02)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        statuses = [(await stack.result(t, wait=0))["status"] for t in task_ids]
        assert statuses == ["PENDING"] * 6
        rescuer = Batcher.from_settings(batcher_settings(
            redis_url, url, claim_idle_ms=500, claim_interval_ms=200, max_wait_ms=5,
            max_inflight_batches=6))
        await rescuer.start()
        try:
            results = await stack.results(task_ids, wait=25)
        finally:
            await rescuer.stop()
    assert [r["status"] for r in results] == ["SUCCESS"] * 6
    assert _reclaimed(rescuer) == 6
    # Tasks that were at a batcher when it died are suspects: each goes to Triton alone, so one
    # that crashes batchers cannot take its batch-mates down with it.
    executed = executions_since(before, batch_executions(url, "sim_slow"))
    assert executed.pop(1) == 6  # the rescuer's six single calls
    assert sum(size * n for size, n in executed.items()) == 6, executed  # the killed batcher's
    assert stream_lengths(redis_client) == 0 and pending_count(redis_client) == 0


async def test_a_task_that_keeps_killing_batchers_is_dead_lettered(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """Delivered over max_deliveries times (each reclaim counts): FAILED, not retried forever."""
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url)) as stack:
        task_id = await stack.submit("crashes-everyone")
        stream = keys.partition_stream(keys.partition_of(task_id, 16))
        redis_client.xgroup_create(stream, keys.CONSUMER_GROUP, id="0", mkstream=True)
        redis_client.xreadgroup(keys.CONSUMER_GROUP, "crashed-1", {stream: ">"}, count=1)
        entry_id = redis_client.xpending(stream, keys.CONSUMER_GROUP)["min"]
        redis_client.xclaim(stream, keys.CONSUMER_GROUP, "crashed-2", 0, [entry_id])
        rescuer = Batcher.from_settings(batcher_settings(
            redis_url, url, claim_idle_ms=0, claim_interval_ms=100, max_deliveries=2))
        await rescuer.start()
        try:
            result = await stack.result(task_id, wait=10)
        finally:
            await rescuer.stop()
    assert result["status"] == "FAILED"
    assert "delivered 3 times" in result["error"]
    assert len(dead_letters(redis_client)) == 1
    assert stream_lengths(redis_client) == 0


async def test_two_batchers_share_partitions_without_duplicates(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    async with running_stack(
        gateway_settings(redis_url, url),
        batcher_settings(redis_url, url, owned_partitions="0-7", max_wait_ms=20),
        batcher_settings(redis_url, url, owned_partitions="8-15", max_wait_ms=20),
    ) as stack:
        task_ids = await asyncio.gather(*(stack.submit(f"shared-{i}") for i in range(120)))
        results = await stack.results(task_ids)
    assert all(r["status"] == "SUCCESS" for r in results)
    executed = executions_since(before, batch_executions(url, "sim"))
    assert sum(size * n for size, n in executed.items()) == 120  # each ran exactly once
    assert stream_lengths(redis_client) == 0


async def test_a_slow_batch_is_not_taken_over_while_its_batcher_lives(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """A batch at Triton for longer than claim_idle_ms stays with its batcher: no double work."""
    url = triton_server.grpc_url
    before = batch_executions(url, "sim_slow")
    eager = {"claim_idle_ms": 300, "claim_interval_ms": 100, "max_wait_ms": 5}
    async with running_stack(gateway_settings(redis_url, url), batcher_settings(redis_url, url,
                             **eager), batcher_settings(redis_url, url, **eager)) as stack:
        task_ids = await asyncio.gather(*(stack.submit(f"slow-{i}", model="sim_slow")
                                          for i in range(4)))
        results = await stack.results(task_ids)
        reclaimed = [_reclaimed(b) for b in stack.batchers]
    assert all(r["status"] == "SUCCESS" for r in results)
    executed = executions_since(before, batch_executions(url, "sim_slow"))
    assert sum(size * n for size, n in executed.items()) == 4, executed
    assert reclaimed == [0, 0]


async def test_stopping_during_an_outage_hands_work_back_for_others(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """Held work goes back to the queue as new on stop: no reclaim wait, no delivery counted."""
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url)) as stack:
        # queued first: the first read takes all three (once Triton is found down, the reader
        # leaves what is still queued in Redis)
        task_ids = [await stack.submit(f"held-{i}") for i in range(3)]
        stranded = Batcher.from_settings(batcher_settings(
            redis_url, "127.0.0.1:9", max_wait_ms=5, outage_budget_s=60, claim_interval_ms=100))
        await stranded.start()
        assert await wait_until(lambda: not stranded.backend_reachable, 10)
        assert await wait_until(lambda: stranded.held_count == 3, 10)
        registry = stranded.metrics.registry
        assert await wait_until(lambda: registry.get_sample_value("ferry_queue_depth") == 3, 5)
        await stranded.stop()
        assert pending_count(redis_client) == 0 and stream_lengths(redis_client) == 3
        healthy = Batcher.from_settings(batcher_settings(redis_url, url, max_wait_ms=200))
        await healthy.start()
        try:
            results = await stack.results(task_ids, wait=10)
        finally:
            await healthy.stop()
    assert [r["status"] for r in results] == ["SUCCESS"] * 3
    assert healthy.metrics.registry.get_sample_value(
        "ferry_batch_size_count", {"model": "sim", "version": "1"}) == 1  # none a suspect
    assert dead_letters(redis_client) == []


def _reclaimed(batcher: Batcher) -> float | None:
    """Tasks the batcher took over from idle consumers (its ``ferry_tasks_reclaimed_total``)."""
    return batcher.metrics.registry.get_sample_value("ferry_tasks_reclaimed_total")
