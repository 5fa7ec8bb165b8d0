"""Ferry's Redis Cluster client against a real 3-master Redis Cluster of its own (started here, in
every run of the suite): routing, scripts on every node, slots that move (MOVED and ASK), blocking
reads over partitions on different masters, and settings that do not match the server.

Also the gateway's announcements on a cluster (sharded Pub/Sub) following a slot that moves.

The rest of the suite's cluster coverage is the tests marked ``cluster``, which ``make test`` runs
a second time against a cluster (``make test-cluster``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from ferry import keys
from ferry.batcher.worker import Batcher
from ferry.errors import ConfigError
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import cluster_client
from ferry.resp.cluster import ClusterClient, parse_slots
from ferry.resp.sharded import ShardedChannels
from ferry.settings import BatcherSettings, CommonSettings
from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import start_redis, start_redis_cluster
from tests.conftest import TritonServer
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration

Node = tuple[str, int]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis Cluster of this module's own (slots get moved here): its seed URL."""
    nodes, url = start_redis_cluster(tmp_path_factory.mktemp("own-cluster"))
    yield url
    for node in nodes:
        node.stop(grace_s=5)


@pytest.fixture
def admin(cluster: str) -> Iterator[redis.RedisCluster]:
    client = redis.RedisCluster.from_url(cluster)
    client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    yield client
    client.close()


@pytest.fixture
async def lean(cluster: str) -> AsyncIterator[ClusterClient]:
    client = cluster_client(CommonSettings(redis_url=cluster, redis_cluster=True), "test")
    yield client
    await client.close()


def slot_table(admin: redis.RedisCluster) -> list[Node | None]:
    """Who serves each slot, as the cluster says now (CLUSTER SLOTS, parsed by Ferry's own
    function)."""
    seed = admin.get_default_node()  # type: ignore[no-untyped-call]
    with node_client((seed.host, int(seed.port))) as client:
        return parse_slots(client.execute_command("CLUSTER", "SLOTS"),
                           (seed.host, int(seed.port)))


def owner(admin: redis.RedisCluster, key: str) -> Node:
    node = slot_table(admin)[key_slot(key.encode())]
    assert node is not None
    return node


def node_client(node: Node) -> redis.Redis:
    return redis.Redis(host=node[0], port=node[1])


def node_id(node: Node) -> str:
    with node_client(node) as client:
        return str(client.execute_command("CLUSTER", "MYID").decode())


def masters(admin: redis.RedisCluster) -> list[Node]:
    return sorted({n for n in slot_table(admin) if n is not None})


def keys_on_every_master(admin: redis.RedisCluster) -> dict[Node, str]:
    """A partition key served by each master (16 partitions reach all three)."""
    found: dict[Node, str] = {}
    for partition in range(16):
        key = keys.partition_stream(partition)
        found.setdefault(owner(admin, key), key)
    assert len(found) == 3
    return found


async def test_pipelines_reach_every_master_and_answer_in_order(
    lean: ClusterClient, admin: redis.RedisCluster,
) -> None:
    names = [keys.task_key("a" * 32, p) for p in range(16)]
    assert await lean.pipeline([("SET", n, i) for i, n in enumerate(names)]) == [b"OK"] * 16
    assert await lean.pipeline([("GET", n) for n in names]) == [b"%d" % i for i in range(16)]
    assert len({owner(admin, n) for n in names}) == 3
    assert await lean.execute("PING") == b"PONG"
    with pytest.raises(Exception, match="WRONGTYPE"):
        await lean.pipeline([("GET", names[0]), ("HGET", names[1], "f")])


async def test_scripts_run_on_every_master_and_survive_a_flushed_cache(
    lean: ClusterClient, admin: redis.RedisCluster,
) -> None:
    script = lean.register_script("return redis.call('INCR', KEYS[1])")
    on_master = keys_on_every_master(admin)
    assert await lean.pipeline([script.command([k + ":n"], []) for k in on_master.values()]) == [
        1, 1, 1]
    for node in on_master:  # the script cache goes away everywhere under live connections
        with node_client(node) as client:
            client.script_flush()
    assert await lean.pipeline([script.command([k + ":n"], []) for k in on_master.values()]) == [
        2, 2, 2]  # reloaded, and each ran once


async def test_a_slot_that_moved_is_followed_after_moved_and_ask(
    lean: ClusterClient, admin: redis.RedisCluster,
) -> None:
    key = keys.task_key("b" * 32, 3)
    slot = key_slot(key.encode())
    assert await lean.execute("SET", key, "before") == b"OK"  # the client knows the slot map
    source = owner(admin, key)
    target = next(n for n in masters(admin) if n != source)
    source_id, target_id = node_id(source), node_id(target)
    with node_client(source) as src, node_client(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        src.execute_command("MIGRATE", target[0], target[1], "", 0, 5000, "KEYS", key)
        # Mid-migration: the source answers ASK; the client asks the target once.
        assert await lean.execute("GET", key) == b"before"
        for node in masters(admin):
            with node_client(node) as each:
                each.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    # Migrated: the source answers MOVED; the client learns the new map and goes there.
    assert await lean.execute("SET", key, "after") == b"OK"
    assert await lean.execute("GET", key) == b"after"
    with node_client(target) as dst:
        assert dst.get(key) == b"after"
        dst.delete(key)  # put the slot back where it was, empty
    for node in [source, *(n for n in masters(admin) if n != source)]:
        with node_client(node) as each:
            each.execute_command("CLUSTER", "SETSLOT", slot, "NODE", source_id)


def queue_on(url: str, owned: list[int]) -> tuple[RedisStreamQueue, CommonSettings]:
    settings = CommonSettings(redis_url=url, redis_cluster=True)
    queue = RedisStreamQueue(cluster_client(settings, "commands"),
                             cluster_client(settings, "reader"), partitions=16, owned=owned,
                             consumer="c1",
                             blocker=lambda: cluster_client(settings, "blocked-reader"))
    return queue, settings


def blocked_clients(admin: redis.RedisCluster) -> int:
    total = 0
    for node in masters(admin):
        with node_client(node) as client:
            total += int(client.info("clients")["blocked_clients"])
    return total


async def test_a_blocking_read_over_every_master_wakes_on_the_first_entry(
    cluster: str, admin: redis.RedisCluster,
) -> None:
    queue, _ = queue_on(cluster, list(range(16)))
    try:
        await queue.ensure_groups()
        assert await queue.read(10, 50) == []  # nothing there: it blocked, and timed out
        for partition in (0, 7, 13):  # each on some master
            reading = asyncio.ensure_future(queue.read(10, 3000))
            assert await wait_until(lambda: blocked_clients(admin) == 16, 5)  # all blocked
            started = time.monotonic()
            admin.xadd(keys.partition_stream(partition), {keys.TASK_FIELD: b"not an envelope"})
            deliveries = await asyncio.wait_for(reading, 2)
            assert time.monotonic() - started < 1.0  # woken, not timed out
            assert [d.partition for d in deliveries] == [partition]
            assert deliveries[0].task is None and deliveries[0].problem  # handed on, to fail
            assert blocked_clients(admin) == 0  # the other 15 were unblocked
        # Entries in several partitions at once: one read returns them all.
        for partition in (1, 2, 3, 4, 5):
            admin.xadd(keys.partition_stream(partition), {keys.TASK_FIELD: b"x"})
        assert sorted(d.partition for d in await queue.read(10, 1000)) == [1, 2, 3, 4, 5]
        pending = admin.xpending(keys.partition_stream(0), keys.CONSUMER_GROUP)
        assert pending["pending"] == 1  # read, held until acknowledged (at least once)
    finally:
        await queue.close()
        await queue.redis.close()


async def test_single_redis_settings_refuse_a_cluster_and_cluster_settings_a_single_redis(
    cluster: str, triton_server: TritonServer, tmp_path: Path,
) -> None:
    batcher = Batcher.from_settings(BatcherSettings(
        redis_url=cluster, triton_url=triton_server.grpc_url, metrics_port=0))
    with pytest.raises(ConfigError, match="is a Redis Cluster node: set FERRY_REDIS_CLUSTER"):
        await batcher.start()
    await batcher.stop()
    single: ManagedProcess
    single, url = start_redis(tmp_path / "single")
    try:
        client = cluster_client(CommonSettings(redis_url=url, redis_cluster=True), "test")
        with pytest.raises(ConfigError, match="is not a cluster"):
            await client.execute("GET", "k")
        await client.close()
    finally:
        single.stop(grace_s=5)


async def test_sharded_announcements_are_heard_where_their_slot_is_and_follow_it_when_it_moves(
    lean: ClusterClient, admin: redis.RedisCluster,
) -> None:
    """The gateway's announcements on a cluster: every partition's copy of a channel heard on
    the node that owns the partition's slot (SPUBLISH there reaches no other node); when the
    slot moves, Redis ends the subscription and the subscriber finds the slot's new owner."""
    tag, channel = keys.slot_tag(3), keys.done_channel("test")
    heard: list[bytes] = []
    connects: list[float] = []
    sharded = ShardedChannels(lean, [tag], [channel], heard.append,
                              lambda: connects.append(time.monotonic()))
    await sharded.start()
    source = owner(admin, keys.partition_stream(3))
    target = next(n for n in masters(admin) if n != source)
    slot = key_slot(tag.encode())
    try:
        assert await wait_until(sharded.connected.is_set, 5)
        # a node that does not own the slot refuses it
        with node_client(target) as elsewhere, pytest.raises(redis.exceptions.MovedError):
            elsewhere.execute_command("SPUBLISH", channel + tag, b"wrong node")
        assert await lean.execute("SPUBLISH", channel + tag, b"one") == 1
        assert await wait_until(lambda: heard == [b"one"], 5)
        for node in [target, source, *(n for n in masters(admin) if n not in (source, target))]:
            with node_client(node) as each:  # the (empty) slot moves to another master
                each.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
        assert await wait_until(lambda: len(connects) == 2, 10)  # subscribed again, there
        with node_client(target) as now:
            assert now.execute_command("SPUBLISH", channel + tag, b"two") == 1
        assert await wait_until(lambda: heard == [b"one", b"two"], 5)
    finally:
        await sharded.stop()
        for node in [source, *(n for n in masters(admin) if n != source)]:
            with node_client(node) as each:
                each.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(source))
