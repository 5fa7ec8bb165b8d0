"""Tensor tasks batched by the batcher, against the real Redis and Triton: Triton's example
``simple`` (INPUT0, INPUT1 FP32 [16] -> OUTPUT0 sum, OUTPUT1 difference; 8 rows a call)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import redis

from ferry import keys
from ferry.oip.answer import answer_tensors
from ferry.v1.task_pb2 import Task, Tensor
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Stack,
    batch_executions,
    batcher_settings,
    dead_letters,
    executions_since,
    gateway_settings,
    running_stack,
    settled_executions,
)

pytestmark = [pytest.mark.integration]  # Triton's tensors: the Redis Cluster adds nothing
Rows = npt.NDArray[np.float32]


def simple_task(a: Rows, b: Rows, outputs: Sequence[str] = ()) -> Task:
    """A task for ``simple`` with rows ``a`` and ``b`` (each [n, 16])."""
    inputs = [Tensor(name=name, datatype="FP32", shape=list(x.shape), contents=x.tobytes())
              for name, x in (("INPUT0", a), ("INPUT1", b))]
    return Task(task_id=keys.new_task_id(), model="simple", inputs=inputs, outputs=outputs,
                enqueued_at_ms=int(time.time() * 1000), request_id=f"r-{a.shape[0]}")


async def admit_all(stack: Stack, tasks: Sequence[Task]) -> list[dict[str, Any]]:
    """Put the tasks straight into the queue (the gateway's store), then wait for their ends."""
    await stack.admit_directly(tasks)
    return await stack.results([t.task_id for t in tasks])


def outputs_of(result: dict[str, Any]) -> dict[str, Rows]:
    assert result["status"] == "SUCCESS", result
    return {t.name: np.frombuffer(t.raw, dtype="<f4").reshape(t.shape)
            for t in answer_tensors(result["output"])}


def random_rows(rng: np.random.Generator, rows: int) -> Rows:
    return rng.standard_normal((rows, 16)).astype(np.float32)


async def test_tensor_requests_travel_together_within_the_models_rows(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url, rng = triton_server.grpc_url, np.random.default_rng(16)
    pairs = [(random_rows(rng, n), random_rows(rng, n)) for n in rng.integers(1, 4, 20)]
    before = await settled_executions(url, "simple")  # an earlier test's last ones counted
    async with running_stack(gateway_settings(redis_url, url), batcher_settings(
            redis_url, url, max_wait_ms=300, adaptive_flush=False)) as stack:
        results = await admit_all(stack, [simple_task(a, b) for a, b in pairs])
        registry = stack.batchers[0].metrics.registry
    rows = sum(a.shape[0] for a, _ in pairs)
    assert registry.get_sample_value("ferry_batch_size_sum",
                                     {"model": "simple", "version": "1"}) == rows
    for (a, b), result in zip(pairs, results, strict=True):
        out = outputs_of(result)
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        assert result["model_version"] == "1" and result["output"]["id"] == f"r-{a.shape[0]}"
    executions = executions_since(before, batch_executions(url, "simple"))
    assert sum(size * n for size, n in executions.items()) == rows
    assert sum(executions.values()) < len(pairs)  # more than one request a call, on average
    assert max(executions) <= 8  # never more rows than the model takes


async def test_requests_asking_other_outputs_travel_apart(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url, rng = triton_server.grpc_url, np.random.default_rng(61)
    pairs = [(random_rows(rng, 1), random_rows(rng, 1)) for _ in range(12)]
    asked = [("OUTPUT0",) if i % 2 else () for i in range(len(pairs))]
    async with running_stack(gateway_settings(redis_url, url), batcher_settings(
            redis_url, url, max_wait_ms=300, adaptive_flush=False)) as stack:
        results = await admit_all(stack, [simple_task(a, b, outputs)
                                          for (a, b), outputs in zip(pairs, asked, strict=True)])
    for (a, b), outputs, result in zip(pairs, asked, results, strict=True):
        out = outputs_of(result)  # a mixed call would give every task the same outputs
        assert sorted(out) == (["OUTPUT0"] if outputs else ["OUTPUT0", "OUTPUT1"])
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)


async def test_a_request_triton_refuses_fails_and_its_batch_mates_succeed(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url, rng = triton_server.grpc_url, np.random.default_rng(7)
    pairs = [(random_rows(rng, 2), random_rows(rng, 2)) for _ in range(6)]
    tasks = [simple_task(a, b) for a, b in pairs]
    bad = tasks[3]
    bad.inputs[1].contents = bad.inputs[1].contents[:-4]  # a float short of its shape
    async with running_stack(gateway_settings(redis_url, url), batcher_settings(
            redis_url, url, max_wait_ms=300, adaptive_flush=False)) as stack:
        results = await admit_all(stack, tasks)
    refused = results.pop(3)
    assert refused["status"] == "FAILED" and "INPUT1" in refused["error"], refused
    for result in results:
        assert outputs_of(result)["OUTPUT0"].shape == (2, 16)
    letters = dead_letters(redis_client)
    assert [letter[b"task_id"].decode() for letter in letters] == [bad.task_id]
