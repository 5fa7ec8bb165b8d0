"""Batcher replicas whose partitions follow the replica count (``owned_partitions=auto``):
scaling from one replica to two while tasks flow loses none."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ferry.batcher.supervisor import Supervisor
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    gateway_settings,
    running_gateway,
    stream_lengths,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


class Scale:
    """The StatefulSet's replica count, as a test sets it."""

    def __init__(self, count: int) -> None:
        self.count = count

    async def __call__(self) -> int:
        return self.count


async def test_ownership_follows_the_replica_count_without_loss(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    scale = Scale(1)
    supervisors = [Supervisor(batcher_settings(redis_url, url, owned_partitions="auto",
                                               statefulset="ferry-batcher",
                                               replicas_check_s=0.1),
                              replicas=scale, hostname=f"ferry-batcher-{ordinal}")
                   for ordinal in (0, 1)]
    running = [asyncio.create_task(s.supervise()) for s in supervisors]
    try:
        async with running_gateway(gateway_settings(redis_url, url)) as client:
            assert await wait_until(lambda: supervisors[0].owned == tuple(range(16)), 10)
            assert supervisors[1].owned == ()  # ordinal 1 of 1 replica: nothing
            ids = []
            for i in range(120):
                if i == 40:
                    scale.count = 2  # scaled up while tasks flow
                answer = await client.post("/v1/inference?model=sim", content=b"t%d" % i,
                                           headers={"Content-Type": "text/plain"})
                ids.append(answer.json()["task_id"])
                await asyncio.sleep(0.01)  # pacing: tasks keep flowing across the scale-up
            assert await wait_until(lambda: supervisors[1].owned == tuple(range(1, 16, 2)), 10)
            assert supervisors[0].owned == tuple(range(0, 16, 2))
            results = [(await client.get(f"/v1/result/{t}?wait=20")).json() for t in ids]
    finally:
        for supervisor in supervisors:
            supervisor.stopping.set()
        assert await asyncio.wait_for(asyncio.gather(*running), 30) == [0, 0]
    assert [r["status"] for r in results] == ["SUCCESS"] * 120
    assert stream_lengths(redis_client) == 0
