"""How batches leave, against a real Triton: early when nobody else is coming, together while the
backend is busy, and never more at once than the model has instances."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from ferry.batcher.worker import Batcher
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    executions_since,
    gateway_settings,
    known_model,
    running_stack,
    wait_until,
)

pytestmark = pytest.mark.integration


def inflight(batcher: Batcher, model: str) -> int:
    """Batches of ``model`` at Triton now (0 before the batcher has seen the model)."""
    state = batcher.model_state(model)
    return state.inflight if state else 0


async def test_a_lone_request_leaves_at_once_when_the_backend_is_idle(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=2000)) as stack:
        started = time.monotonic()
        result = await stack.result(await stack.submit("alone"))
        elapsed = time.monotonic() - started
        registry = stack.batchers[0].metrics.registry
    assert result["status"] == "SUCCESS"
    assert elapsed < 1.0, f"it waited for its departure time ({elapsed:.2f} s)"
    assert executions_since(before, batch_executions(url, "sim")) == {1: 1}
    assert registry.get_sample_value("ferry_batch_flush_total",
                                     {"model": "sim", "reason": "adaptive"}) == 1


async def test_requests_arriving_while_the_backend_is_busy_leave_together(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """One instance: the first request goes alone, the next nine board while it runs (1.5 s) and
    leave as one batch the moment the instance is free, long before their max wait."""
    url = triton_server.grpc_url
    before = batch_executions(url, "sim_slow")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=60_000)) as stack:
        batcher = stack.batchers[0]
        first = await stack.submit("first", model="sim_slow")
        assert await wait_until(lambda: inflight(batcher, "sim_slow") == 1, 10)
        rest = await asyncio.gather(*(stack.submit(f"next-{i}", model="sim_slow")
                                      for i in range(9)))
        started = time.monotonic()
        results = await stack.results([first, *rest], wait=20)
        elapsed = time.monotonic() - started
    assert [r["status"] for r in results] == ["SUCCESS"] * 10
    assert executions_since(before, batch_executions(url, "sim_slow")) == {1: 1, 9: 1}
    assert elapsed < 5.0


async def test_a_model_gets_as_many_batches_at_once_as_it_has_instances(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim_slow2")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=60_000)) as stack:
        batcher = stack.batchers[0]
        first = await stack.submit("one", model="sim_slow2")
        assert await wait_until(lambda: inflight(batcher, "sim_slow2") == 1, 10)
        second = await stack.submit("two", model="sim_slow2")  # the second instance is free
        assert await wait_until(lambda: inflight(batcher, "sim_slow2") == 2, 10)
        assert known_model(batcher, "sim_slow2").slots == 2
        peak = Peak(batcher, "sim_slow2")
        watching = asyncio.create_task(peak.watch())
        rest = await asyncio.gather(*(stack.submit(f"more-{i}", model="sim_slow2")
                                      for i in range(6)))
        results = await stack.results([first, second, *rest], wait=20)
        watching.cancel()
    assert [r["status"] for r in results] == ["SUCCESS"] * 8
    # The six left as one batch once an instance was free (Triton ran them together), and
    # until they were answered, no third batch was ever at Triton.
    assert executions_since(before, batch_executions(url, "sim_slow2")) == {1: 2, 6: 1}
    assert peak.most == 2


class Peak:
    """The most batches of a model at Triton at once while ``watch`` runs."""

    def __init__(self, batcher: Batcher, model: str) -> None:
        self.batcher, self.model, self.most = batcher, model, 0

    async def watch(self) -> None:
        while True:  # read every 5 ms: a batch of the slow models is at Triton for 1.5 s
            self.most = max(self.most, inflight(self.batcher, self.model))
            await asyncio.sleep(0.005)


async def test_max_inflight_batches_overrides_the_instance_count(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, "sim_slow2")
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=60_000,
                                              max_inflight_batches=1)) as stack:
        batcher = stack.batchers[0]
        first = await stack.submit("one", model="sim_slow2")
        assert await wait_until(lambda: inflight(batcher, "sim_slow2") == 1, 10)
        rest = await asyncio.gather(*(stack.submit(f"later-{i}", model="sim_slow2")
                                      for i in range(3)))
        results = await stack.results([first, *rest], wait=20)
    assert [r["status"] for r in results] == ["SUCCESS"] * 4
    assert executions_since(before, batch_executions(url, "sim_slow2")) == {1: 1, 3: 1}


async def test_a_busy_backend_with_no_max_wait_does_not_make_the_reader_poll(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """max_wait_ms 0 and every slot busy: the parked reader still waits between reads."""
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url, max_wait_ms=0)) as stack:
        batcher = stack.batchers[0]
        task_id = await stack.submit("busy", model="sim_slow")
        assert await wait_until(lambda: inflight(batcher, "sim_slow") == 1, 10)
        before = _reads(redis_client)
        # The reads of a second while parked: time itself must pass (sim_slow holds its only
        # instance for 1.5 s, so the second is all spent parked).
        await asyncio.sleep(1.0)
        reads = _reads(redis_client) - before
        result = await stack.result(task_id)
    assert result["status"] == "SUCCESS"
    assert reads <= 250, f"{reads} reads in a second while parked"


def _reads(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_xreadgroup", {}).get("calls", 0))
