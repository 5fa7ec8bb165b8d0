"""Chaos under held infer calls: a batcher killed with SIGKILL while REST and gRPC clients wait
for their answers, and a Redis restart in the middle of their batch. Every held call gets its
answer or a clear error, none hangs, and no task is lost."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from ferry.batcher.worker import Batcher
from ferry.settings import BatcherSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_server import start_redis
from tests.conftest import TritonServer, sync_client
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    calls_at_triton,
    executions_since,
    gateway_settings,
    pending_count,
    running_batchers,
    serving,
    task_keys,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
MODEL = "sim_slow"  # 1.5 s a batch: long enough to break things while it runs
CALLS = 6  # of each protocol (3 when a batcher dies: its tasks are then retried one by one)


def word_input(word: str) -> list[InferInput]:
    tensor = InferInput("INPUT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[word.encode()]], dtype=np.object_))
    return [tensor]


def expected(word: str) -> dict[str, Any]:
    """What the simulator answers for a word: its digest and length."""
    return {"sha256": hashlib.sha256(word.encode()).hexdigest(), "length": len(word)}


def held_calls(grpc_client: triton_grpc_aio.InferenceServerClient, http: httpx.AsyncClient,
               tag: str, count: int = CALLS) -> dict[str, asyncio.Future[Any]]:
    """``count`` gRPC and ``count`` REST infer calls of MODEL, by the word each sends."""
    calls: dict[str, Awaitable[Any]] = {}
    for i in range(count):
        calls[f"grpc-{tag}-{i}"] = grpc_client.infer(MODEL, word_input(f"grpc-{tag}-{i}"))
        word = f"rest-{tag}-{i}"
        calls[word] = http.post(f"/v2/models/{MODEL}/infer", json={"inputs": [{
            "name": "INPUT", "shape": [1, 1], "datatype": "BYTES", "data": [word]}]})
    return {word: asyncio.ensure_future(call) for word, call in calls.items()}


def answered(word: str, outcome: Any) -> bool:
    """Whether a call got its own answer (True), or a clear error (False); else it fails."""
    if isinstance(outcome, InferenceServerException):
        assert outcome.status() == "StatusCode.UNAVAILABLE" and outcome.message(), outcome
        return False
    if isinstance(outcome, httpx.Response):
        if outcome.status_code == 503:
            assert outcome.json()["error"], outcome.text
            return False
        assert outcome.status_code == 200, outcome.text
        (output,) = outcome.json()["outputs"]
        assert json.loads(output["data"][0]) == expected(word)
        return True
    assert not isinstance(outcome, BaseException), repr(outcome)
    assert json.loads(outcome.as_numpy("OUTPUT")[0][0]) == expected(word)
    return True


async def test_a_batcher_killed_under_held_calls_loses_none_of_them(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    url = triton_server.grpc_url
    settings = batcher_settings(redis_url, url, max_wait_ms=5, metrics_port=free_port())
    metrics = f"http://{LOOPBACK}:{settings.metrics_port}"
    env = {**os.environ, **to_env(settings, BatcherSettings)}
    async with serving(gateway_settings(redis_url, url)) as ferry, \
            triton_grpc_aio.InferenceServerClient(ferry.grpc) as grpc_client, \
            httpx.AsyncClient(base_url=ferry.http, timeout=90) as http:
        calls = held_calls(grpc_client, http, "kill", count=3)
        assert await wait_until(lambda: len(task_keys(redis_client)) == 6, 20)
        doomed = subprocess.Popen([sys.executable, "-m", "ferry", "batcher"], env=env)
        try:  # kill it while its batch is at Triton
            assert await wait_until(lambda: pending_count(redis_client) == 6, 20)
            assert await wait_until(lambda: calls_at_triton(metrics) == 1, 20, interval_s=0.02)
        finally:
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(10)
        rescuer = Batcher.from_settings(batcher_settings(
            redis_url, url, claim_idle_ms=500, claim_interval_ms=200, max_wait_ms=5,
            max_inflight_batches=6))
        await rescuer.start()
        try:
            outcomes = await asyncio.wait_for(asyncio.gather(*calls.values(),
                                                             return_exceptions=True), 60)
        finally:
            await rescuer.stop()
    assert all(answered(word, outcome) for word, outcome in zip(calls, outcomes, strict=True))


async def test_a_redis_restart_under_held_calls_loses_no_task(
        triton_server: TritonServer, tmp_path: Path) -> None:
    port = free_port()
    proc, redis_url = start_redis(tmp_path / "redis", port=port, persist=True)
    url = triton_server.grpc_url
    store = sync_client(redis_url)
    try:
        async with serving(gateway_settings(redis_url, url, redis_cluster=False)) as ferry, \
                triton_grpc_aio.InferenceServerClient(ferry.grpc) as grpc_client, \
                httpx.AsyncClient(base_url=ferry.http, timeout=90) as http:
            batcher = Batcher.from_settings(batcher_settings(  # reclaims what it could not
                redis_url, url, max_wait_ms=5, redis_cluster=False,  # settle within 3 s
                claim_idle_ms=3000, claim_interval_ms=500))
            await batcher.start()
            try:
                calls = held_calls(grpc_client, http, "restart")
                assert await wait_until(lambda: pending_count(store) == 2 * CALLS, 20)
                proc.stop(grace_s=10)  # mid-batch: the batch finishes while Redis is away
                stopped = time.monotonic()
                assert await wait_until(lambda: settle_retries(batcher) > 0, 20)
                # and it stays away 2 s in all: an outage has a length, which time itself makes
                await asyncio.sleep(max(0.0, stopped + 2.0 - time.monotonic()))
                proc, _ = start_redis(tmp_path / "redis", port=port, persist=True)
                outcomes = await asyncio.wait_for(asyncio.gather(*calls.values(),
                                                                 return_exceptions=True), 60)
                served = [answered(w, o) for w, o in zip(calls, outcomes, strict=True)]
                finals = await asyncio.wait_for(final_statuses(http, store), 60)
            finally:
                await batcher.stop()
    finally:
        store.close()
        proc.stop(grace_s=5)
    assert sum(served) >= 1  # and every other call a clear error, none hanging
    assert finals == ["SUCCESS"] * 2 * CALLS  # nothing lost


def settle_retries(batcher: Batcher) -> float:
    """The batcher's writes of results that failed and were tried again, for any reason."""
    return sum(sample.value for metric in batcher.metrics.registry.collect()
               for sample in metric.samples if sample.name == "ferry_settle_retries_total")


async def final_statuses(http: httpx.AsyncClient, store: redis.Redis) -> list[str]:
    """Every task's final status, read through /v1 (waiting for each to end)."""
    statuses = []
    for key in task_keys(store):
        task_id = key.decode().rsplit(":task:", 1)[1]
        answer = await http.get(f"/v1/result/{task_id}", params={"wait": 20})
        assert answer.status_code == 200, answer.text
        statuses.append(answer.json()["status"])
    return statuses


def keyed_calls(grpc_client: triton_grpc_aio.InferenceServerClient, http: httpx.AsyncClient,
                words: list[str]) -> dict[str, asyncio.Future[Any]]:
    """A held gRPC call (even index) or REST call (odd) per word, its key the word's."""
    calls: dict[str, Awaitable[Any]] = {}
    for i, word in enumerate(words):
        key = {"idempotency-key": f"key-{word}"}
        calls[word] = (grpc_client.infer(MODEL, word_input(word), headers=key) if i % 2 == 0
                       else http.post(f"/v2/models/{MODEL}/infer", headers=key, json={
                           "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "BYTES",
                                       "data": [word]}]}))
    return {word: asyncio.ensure_future(call) for word, call in calls.items()}


async def test_a_gateway_killed_under_held_calls_is_retried_onto_the_same_tasks(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
        tmp_path: Path) -> None:
    """A protocol call held at a gateway that dies gets a clear error; its retry at another
    gateway with the same Idempotency-Key is held on the task the first call admitted: every
    call answered, each task run once, none admitted twice."""
    url = triton_server.grpc_url
    doomed = gateway_settings(redis_url, url, workers=1)
    process = ManagedProcess("gateway", [sys.executable, "-m", "ferry", "gateway"],
                             env=env_with(to_env(doomed, GatewaySettings)),
                             log_path=tmp_path / "gateway.log")
    words = [f"keyed-{i}" for i in range(4)]
    before = batch_executions(url, MODEL)
    async with running_batchers(batcher_settings(redis_url, url, max_wait_ms=5)), \
            serving(gateway_settings(redis_url, url)) as other:
        process.start()
        try:
            address = f"http://{LOOPBACK}:{doomed.port}"
            process.wait_ready(lambda: http_ok(f"{address}/readyz"), 60)
            async with triton_grpc_aio.InferenceServerClient(
                    f"{LOOPBACK}:{doomed.grpc_port}") as grpc_client, \
                    httpx.AsyncClient(base_url=address, timeout=90) as http:
                calls = keyed_calls(grpc_client, http, words)
                assert await wait_until(lambda: len(task_keys(redis_client)) == len(words), 20)
                process.stop(sig=signal.SIGKILL)  # while the batch is at Triton (1.5 s)
                first = await asyncio.wait_for(asyncio.gather(*calls.values(),
                                                              return_exceptions=True), 30)
        finally:
            process.stop(grace_s=5)
        assert all(isinstance(outcome, (InferenceServerException, httpx.TransportError))
                   for outcome in first), first  # a clear error: the connection broke
        async with triton_grpc_aio.InferenceServerClient(other.grpc) as grpc_client, \
                httpx.AsyncClient(base_url=other.http, timeout=90) as http:
            retries = keyed_calls(grpc_client, http, words)
            outcomes = await asyncio.wait_for(asyncio.gather(*retries.values(),
                                                             return_exceptions=True), 60)
            assert all(answered(w, o) for w, o in zip(retries, outcomes, strict=True))
            reused = await http.post(f"/v2/models/{MODEL}/infer", headers={
                "idempotency-key": f"key-{words[1]}"}, json={"inputs": [{
                    "name": "INPUT", "shape": [1, 1], "datatype": "BYTES", "data": ["other"]}]})
    assert reused.status_code == 422 and "Idempotency-Key" in reused.json()["error"]
    assert len(task_keys(redis_client)) == len(words)  # no retry admitted a task of its own
    ran = executions_since(before, batch_executions(url, MODEL))
    assert sum(size * count for size, count in ran.items()) == len(words)  # each task once
