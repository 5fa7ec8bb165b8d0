"""No accepted task lost when Redis fails over: Sentinel, Redis Cluster, WAIT, memory pressure.

Every test here runs real ``redis-server`` and ``redis-sentinel`` processes on loopback and kills
them with ``kill -9`` under open-loop load, then asks for every task that was answered 202.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis
from redis.crc import key_slot

from ferry import keys
from ferry.priority import Priority
from ferry.redis_conn import lean
from ferry.settings import CommonSettings, GatewaySettings
from ferry.stack.redis_ha import (
    ReplicatedCluster,
    SentinelGroup,
    start_replicated_cluster,
    start_sentinel_group,
)
from ferry.tasks.record import TaskRecord
from ferry.tasks.redis_store import RedisTaskStore
from ferry.tasks.scripts import Withdrawal
from ferry.v1.task_pb2 import Task
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    gateway_settings,
    running_stack,
    stream_lengths,
    task_keys,
    wait_until,
)

pytestmark = [pytest.mark.integration]

Fault = tuple[float, Callable[[], Awaitable[None]]]  # seconds into the load, what happens then


@dataclass
class Ledger:
    """What the load saw: every accepted task with its input, and the refusals retried."""

    accepted: dict[str, bytes] = field(default_factory=dict)
    retried: dict[str, int] = field(default_factory=dict)
    given_up: int = 0


async def _submit(client: httpx.AsyncClient, payload: bytes, ledger: Ledger) -> None:
    """POST one input until it is accepted (with one Idempotency-Key: retries are safe)."""
    headers = {"Content-Type": "application/octet-stream", "Idempotency-Key": uuid.uuid4().hex}
    for attempt in range(60):
        try:
            response = await client.post("/v1/inference?model=sim", content=payload,
                                         headers=headers)
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        else:
            if response.status_code == 202:
                ledger.accepted[str(response.json()["task_id"])] = payload
                return
            assert response.status_code in (429, 503), response.text  # never a 500
            code = str(response.json()["error"]["code"])
        ledger.retried[code] = ledger.retried.get(code, 0) + 1
        await asyncio.sleep(min(0.05 * 2 ** attempt, 0.5))
    ledger.given_up += 1


async def _drive(client: httpx.AsyncClient, *, seconds: float, rate: float,
                 faults: list[Fault]) -> Ledger:
    """Open-loop load of distinct inputs at ``rate`` per second, with ``faults`` on time."""
    ledger, sent = Ledger(), []
    start = time.monotonic()
    for at, fault in faults:
        sent.append(asyncio.ensure_future(_at(start + at, fault)))
    for index in range(int(seconds * rate)):
        await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
        payload = f"ha-{index}-{uuid.uuid4().hex}".encode()
        sent.append(asyncio.ensure_future(_submit(client, payload, ledger)))
    await asyncio.gather(*sent)
    return ledger


async def _at(when: float, fault: Callable[[], Awaitable[None]]) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))
    await fault()


async def _lost_and_wrong(client: httpx.AsyncClient, ledger: Ledger) -> tuple[list[str],
                                                                              list[str]]:
    """The accepted tasks that no longer exist or never ended, and those answered wrongly."""
    lost: list[str] = []
    wrong: list[str] = []

    async def check(task_id: str, payload: bytes) -> None:
        body: dict[str, Any] = {}
        for _ in range(6):  # long polls, 10 s each at most
            response = await client.get(f"/v1/result/{task_id}", params={"wait": 10})
            body = response.json() if response.status_code == 200 else {}
            if response.status_code != 200 or body.get("status") != "PENDING":
                break
        if body.get("status") != "SUCCESS":
            lost.append(f"{task_id}: {body or response.status_code}")
        elif _answer(body) != hashlib.sha256(payload).hexdigest():
            wrong.append(task_id)

    await asyncio.gather(*(check(t, p) for t, p in ledger.accepted.items()))
    return lost, wrong


def _answer(body: dict[str, Any]) -> str:
    """The sim model's answer: the SHA-256 of the input it was given."""
    output = body.get("output")
    answer = output.get("OUTPUT") if isinstance(output, dict) else None
    return str(answer.get("sha256")) if isinstance(answer, dict) else ""


def _ha_settings(triton: TritonServer, redis_url: str, **redis_settings: Any
                 ) -> tuple[GatewaySettings, Any]:
    common = {"redis_socket_timeout_s": 3.0, "redis_min_replicas": 1, "redis_wait_ms": 500,
              **redis_settings}
    gateway = gateway_settings(redis_url, triton.grpc_url, **common)
    batcher = batcher_settings(redis_url, triton.grpc_url, read_block_ms=500, max_wait_ms=20,
                               claim_idle_ms=3000, **common)
    return gateway, batcher


# -- Sentinel ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    group = start_sentinel_group(tmp_path_factory.mktemp("sentinel"))
    yield group
    group.stop()


def _kill_master(group: SentinelGroup, log: list[str]) -> Callable[[], Awaitable[None]]:
    """``kill -9`` of the master; once the sentinels have promoted a replica, the old master
    starts again and rejoins as a replica."""
    async def fault() -> None:
        old = group.master()
        old.kill(signal.SIGKILL)
        started = time.monotonic()
        new = await asyncio.to_thread(group.wait_failover, old.port)
        log.append(f"master {old.port} killed; {new} promoted in "
                   f"{time.monotonic() - started:.1f} s")
        await asyncio.to_thread(group.restart, old)
        await asyncio.to_thread(group.wait_replica, old)
    return fault


async def test_sentinel_failovers_under_load_lose_no_accepted_task(
        sentinels: SentinelGroup, triton_server: TritonServer) -> None:
    gateway, batcher = _ha_settings(
        triton_server, "redis://127.0.0.1:1/0", redis_sentinels=sentinels.sentinel_spec,
        redis_sentinel_master=sentinels.name)
    log: list[str] = []
    async with running_stack(gateway, batcher) as stack:
        ledger = await _drive(stack.client, seconds=16, rate=40,
                              faults=[(3.0, _kill_master(sentinels, log)),
                                      (10.0, _kill_master(sentinels, log))])
        lost, wrong = await _lost_and_wrong(stack.client, ledger)
    print(f"sentinel: {len(ledger.accepted)} accepted, retried {ledger.retried}; {log}")
    assert len(log) == 2, log  # both failovers happened under load
    assert len(ledger.accepted) >= 500 and ledger.given_up == 0
    assert not lost, f"{len(lost)} accepted tasks lost: {lost[:5]}"
    assert not wrong


# -- Redis Cluster ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def replicated_cluster(tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[ReplicatedCluster]:
    cluster = start_replicated_cluster(tmp_path_factory.mktemp("replicated-cluster"))
    yield cluster
    cluster.stop()


async def test_a_cluster_master_failover_under_load_loses_no_accepted_task(
        replicated_cluster: ReplicatedCluster, triton_server: TritonServer) -> None:
    gateway, batcher = _ha_settings(triton_server, replicated_cluster.url, redis_cluster=True)
    slot = int(key_slot(keys.partition_stream(0, Priority.NORMAL).encode()))
    log: list[str] = []

    async def kill_busy_master() -> None:  # the master of partition 0 (and its neighbours)
        old = replicated_cluster.master_of_slot(slot)
        old.kill(signal.SIGKILL)
        new = await asyncio.to_thread(replicated_cluster.wait_serving, slot, old.port)
        log.append(f"master {old.port} killed; {new.port} serves slot {slot}")

    async with running_stack(gateway, batcher) as stack:
        ledger = await _drive(stack.client, seconds=10, rate=40,
                              faults=[(3.0, kill_busy_master)])
        lost, wrong = await _lost_and_wrong(stack.client, ledger)
    print(f"cluster: {len(ledger.accepted)} accepted, retried {ledger.retried}; {log}")
    assert len(log) == 1
    assert len(ledger.accepted) >= 300 and ledger.given_up == 0
    assert not lost, f"{len(lost)} accepted tasks lost: {lost[:5]}"
    assert not wrong


# -- WAIT and withdrawal on a Redis without replicas --------------------------------------------

@pytest.mark.single_redis
async def test_an_admission_no_replica_confirms_is_withdrawn_and_answered_503(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    gateway = gateway_settings(redis_url, triton_server.grpc_url, redis_min_replicas=1,
                               redis_wait_ms=50)
    async with running_stack(gateway) as stack:
        for _ in range(2):  # the Idempotency-Key was released: the retry is a first try again
            refused = await stack.client.post(
                "/v1/inference?model=sim", content=b"x",
                headers={"Content-Type": "application/octet-stream", "Idempotency-Key": "k1"})
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "not_replicated"
            assert "withdrawn" in refused.json()["error"]["message"]
            assert refused.headers["retry-after"] == "1"
    assert stream_lengths(redis_client) == 0
    assert not task_keys(redis_client)


@pytest.mark.single_redis
async def test_withdrawal_takes_back_only_what_no_batcher_has_read(
        redis_url: str, redis_client: redis.Redis) -> None:
    client = lean(CommonSettings(redis_url=redis_url), "withdraw-test")
    store = RedisTaskStore(client, partitions=1, result_ttl_s=60, pending_ttl_s=60)
    try:
        tasks = [Task(task_id=keys.new_task_id(0, 1), model="sim", payload=b"p",
                      priority=int(Priority.NORMAL)) for _ in range(2)]
        for task in tasks:
            await store.admit(task, TaskRecord.pending(task, time.time()))
        stream = keys.partition_stream(0, Priority.NORMAL)
        redis_client.xgroup_create(stream, keys.CONSUMER_GROUP, id="0", mkstream=True)
        redis_client.xreadgroup(keys.CONSUMER_GROUP, "reader", {stream: ">"}, count=1)
        assert await store.withdraw(tasks[0].task_id) is Withdrawal.KEPT  # a batcher has it
        assert await store.withdraw(tasks[1].task_id) is Withdrawal.GONE
        assert await store.withdraw(tasks[1].task_id) is Withdrawal.GONE  # nothing left
        assert redis_client.exists(store.key(tasks[0].task_id))
        assert not redis_client.exists(store.key(tasks[1].task_id))
        assert redis_client.xlen(stream) == 1
        backlog = redis_client.hgetall(keys.backlog_key(0))
        assert backlog[keys.backlog_field("sim", Priority.NORMAL).encode()] == b"1"
    finally:
        await client.close()


# -- memory pressure ----------------------------------------------------------------------------

@pytest.mark.single_redis
async def test_out_of_memory_refuses_admission_cleanly_and_keeps_results_until_it_can_write(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    gateway = gateway_settings(redis_url, triton_server.grpc_url)
    batcher = batcher_settings(redis_url, triton_server.grpc_url, max_wait_ms=1500)
    payloads = [f"oom-{i}".encode() for i in range(20)]
    try:
        async with running_stack(gateway, batcher) as stack:
            ids = list(await asyncio.gather(*(stack.submit(p) for p in payloads)))
            redis_client.config_set("maxmemory-policy", "noeviction")
            redis_client.config_set("maxmemory", 1)  # every write refused, before the batch
            refused = await stack.client.post("/v1/inference?model=sim", content=b"more",
                                              headers={"Content-Type": "text/plain"})
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "redis_out_of_memory"
            assert "nothing was queued" in refused.json()["error"]["message"]
            ready = await stack.client.get("/readyz")
            assert ready.status_code == 503 and "out of memory" in ready.json()["checks"]["redis"]
            registry = stack.batchers[0].metrics.registry
            assert await wait_until(lambda: (registry.get_sample_value(
                "ferry_settle_retries_total", {"reason": "OOM"}) or 0) >= 3, 20)
            assert stream_lengths(redis_client) == len(payloads)  # nothing half-written
            redis_client.config_set("maxmemory", 0)
            results = await stack.results(ids)
    finally:
        redis_client.config_set("maxmemory", 0)
    assert [r["status"] for r in results] == ["SUCCESS"] * len(payloads)
    assert [_answer(r) for r in results] == [hashlib.sha256(p).hexdigest() for p in payloads]
    assert registry.get_sample_value("ferry_tasks_reclaimed_total") == 0  # kept, not run again
