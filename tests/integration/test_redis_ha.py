"""No accepted task lost when Redis fails over: Sentinel, Redis Cluster, WAIT, memory pressure.

Every test here runs real ``redis-server`` and ``redis-sentinel`` processes on loopback and kills
them with ``kill -9`` under open-loop load, then asks for every task that was answered 202.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from ferry import keys
from ferry.cli import main
from ferry.priority import Priority
from ferry.redis_conn import lean
from ferry.settings import CommonSettings, GatewaySettings
from ferry.stack.redis_ha import (
    ReplicatedCluster,
    SentinelGroup,
    start_replicated_cluster,
    start_sentinel_group,
)
from ferry.stack.state import REDIS_ENV_FILE, REDIS_URL_FILE
from ferry.tasks.record import TaskRecord
from ferry.tasks.redis_store import RedisTaskStore
from ferry.tasks.scripts import Withdrawal
from ferry.v1.task_pb2 import Task
from loadtest.failover import answer, drive, kill_master, lost_and_wrong
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


async def test_sentinel_failovers_under_load_lose_no_accepted_task(
        sentinels: SentinelGroup, triton_server: TritonServer) -> None:
    gateway, batcher = _ha_settings(
        triton_server, "redis://127.0.0.1:1/0", redis_sentinels=sentinels.sentinel_spec,
        redis_sentinel_master=sentinels.name)
    log: list[str] = []
    async with running_stack(gateway, batcher) as stack:
        ledger = await drive(stack.client, seconds=16, rate=40,
                             faults=[(2.0, kill_master(sentinels, log)),
                                     (10.0, kill_master(sentinels, log))])
        lost, wrong = await lost_and_wrong(stack.client, ledger)
    print(f"sentinel: {len(ledger.accepted)} accepted, retried {ledger.retried}; {log}")
    assert len(log) == 2, log  # both failovers happened under load
    assert len(ledger.accepted) >= 600 and ledger.given_up == 0
    assert not lost, f"{len(lost)} accepted tasks lost: {lost[:5]}"
    assert not wrong


def test_ferry_log_tail_reads_a_stack_on_sentinels_through_them(
        sentinels: SentinelGroup, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What ``ferry up`` on Sentinel keeps (a URL whose host is not used, and the sentinels)
    is enough for ``ferry log tail`` to read the master the sentinels name."""
    master = redis.Redis(port=sentinels.master().port)
    master.xadd(keys.log_key("sim", "recent"), {keys.LOG_FIELD: b'{"id":"through-sentinels"}'})
    master.close()
    (tmp_path / REDIS_URL_FILE).write_text("redis://ignored/0\n")
    (tmp_path / REDIS_ENV_FILE).write_text(
        f"FERRY_REDIS_SENTINELS={sentinels.sentinel_spec}\n"
        f"FERRY_REDIS_SENTINEL_MASTER={sentinels.name}\n")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("FERRY_REDIS_URL", "FERRY_REDIS_SENTINELS", "FERRY_STATE_DIR"):
            patch.delenv(name, raising=False)
        assert main(["log", "tail", "sim", "-n", "1", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == '{"id":"through-sentinels"}\n'


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
        killed = time.monotonic()
        old.kill(signal.SIGKILL)
        new = await asyncio.to_thread(replicated_cluster.wait_serving, slot, old.port)
        log.append(f"master {old.port} killed; {new.port} serves slot {slot} after "
                   f"{time.monotonic() - killed:.1f} s")
        print(log[-1], flush=True)  # shown if the test fails later, a timeout included
        # Until the old node is back as its replica, the new master has none: admissions to
        # its slots cannot be confirmed, and are answered 503 (and retried).
        await asyncio.to_thread(replicated_cluster.rejoin, old)
        print(f"{old.port} back as a replica after {time.monotonic() - killed:.1f} s",
              flush=True)

    async with running_stack(gateway, batcher) as stack:
        ledger = await drive(stack.client, seconds=10, rate=40,
                              faults=[(3.0, kill_busy_master)])
        lost, wrong = await lost_and_wrong(stack.client, ledger)
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
        ready = await stack.client.get("/readyz")
        assert ready.status_code == 503
        assert "fewer than redis_min_replicas=1" in ready.json()["checks"]["redis"]
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
    batcher = batcher_settings(redis_url, triton_server.grpc_url, max_wait_ms=1500,
                               adaptive_flush=False)  # the batch leaves 1.5 s after its first
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
    assert [answer(r) for r in results] == [hashlib.sha256(p).hexdigest() for p in payloads]
    assert registry.get_sample_value("ferry_tasks_reclaimed_total") == 0  # kept, not run again
