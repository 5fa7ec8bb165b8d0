"""The task record's whole life in Redis, one script per step: admission, completion, dead
letters, acknowledgement and the announcement that wakes waiting clients."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from ferry import keys
from ferry.codec import encode_task
from ferry.errors import RedisCommandError, TooManyRequestsError
from ferry.queue.base import Delivery
from ferry.redis_conn import lean
from ferry.resp.client import RedisAddress
from ferry.resp.cluster import ClusterClient
from ferry.resp.subscriber import Subscriber
from ferry.settings import CommonSettings
from ferry.stack.redis_server import start_redis
from ferry.tasks.base import Admission, Admitted, Completion
from ferry.tasks.record import EXPIRED_ERROR, Status, StoredRecord, TaskRecord, announcements
from ferry.tasks.redis_store import RedisTaskStore
from ferry.tasks.waiters import ResultWaiters
from ferry.v1.task_pb2 import Task
from tests.conftest import REDIS_CLUSTER
from tests.integration.helpers import (
    FENCE,
    announcement_listener,
    backlog_counts,
    dead_letters,
    fence,
    stream_lengths,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
PARTITIONS = 16


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisTaskStore]:
    client = lean(CommonSettings(redis_url=redis_url, redis_cluster=REDIS_CLUSTER), "test")
    yield RedisTaskStore(client, partitions=PARTITIONS, result_ttl_s=60, pending_ttl_s=600,
                         inline_limit=1024)
    await client.close()


def new_task(payload: bytes = b"data") -> Task:
    return Task(task_id=keys.new_task_id(), model="sim", payload=payload,
                enqueued_at_ms=1_700_000_000_000)


def pending(task: Task) -> TaskRecord:
    return TaskRecord(task.task_id, Status.PENDING, task.model, 1_700_000_000.0)


def read_entries(client: redis.Redis, tasks: list[Task]) -> list[Delivery]:
    """Take the tasks' entries through the consumer group, as a batcher would (in task order)."""
    found: dict[bytes, Delivery] = {}
    for partition in sorted({keys.partition_of(t.task_id, PARTITIONS) for t in tasks}):
        stream = keys.partition_stream(partition)
        with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: made by an earlier call
            client.xgroup_create(stream, keys.CONSUMER_GROUP, id="0")
        reply: Any = client.xreadgroup(keys.CONSUMER_GROUP, "tester", {stream: ">"})
        for _, entries in reply:
            for entry_id, fields in entries:
                found[fields[b"task"]] = Delivery(partition, stream, entry_id.decode(),
                                                  fields[b"task"], None)
    deliveries = [found[encode_task(t)] for t in tasks]
    return [Delivery(d.partition, d.stream, d.entry_id, d.raw, t)
            for d, t in zip(deliveries, tasks, strict=True)]


def calls_of(client: redis.Redis, *commands: str) -> list[int]:
    """How many times Redis has run each command (INFO commandstats)."""
    stats: Any = client.info("commandstats")
    return [int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands]


def read_entry(client: redis.Redis, task: Task) -> Delivery:
    return read_entries(client, [task])[0]


def finished(task: Task, status: Status = Status.SUCCESS, output: Any = None,
             error: str | None = None) -> TaskRecord:
    return TaskRecord(task.task_id, status, task.model, 1_700_000_000.0, "1",
                      1_700_000_001.0, output, error)


async def test_admission_writes_the_pending_record_and_the_entry_at_once(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task()
    admitted = (await store.admit(task, pending(task))).record
    assert admitted.status is Status.PENDING
    partition = keys.partition_of(task.task_id, PARTITIONS)
    key = keys.task_key(task.task_id, partition)
    assert redis_client.hget(key, "status") == b"PENDING"
    assert orjson.loads(redis_client.hget(key, "body") or b"") == pending(task).to_json()
    assert 590 < redis_client.ttl(key) <= 600
    assert redis_client.xlen(keys.partition_stream(partition)) == 1
    assert await store.read(task.task_id) == admitted


async def test_admissions_that_arrive_together_ride_one_call_each_decided_alone(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    """While one admission call is at Redis, the others wait and go in the next call, each
    still decided as if alone, in the order they came: here a backlog limit of 2 per partition
    admits the first two of partition 3's and refuses the rest (one slot: one group on a Redis
    Cluster too); tasks of four partitions ride together on one Redis, by partition on a
    Cluster."""
    admission = Admission(limit=2 * PARTITIONS, partitions=PARTITIONS)
    tasks = [new_task(b"t%d" % i) for i in range(40)]
    for task in tasks:
        task.task_id = keys.new_task_id(3, PARTITIONS)
    calls = store.admissions.calls
    results = await asyncio.gather(*(store.admit(t, pending(t), admission) for t in tasks),
                                   return_exceptions=True)
    assert store.admissions.calls - calls == 2  # the first at once, the other 39 in one call
    assert [isinstance(r, Admitted) for r in results] == [True] * 2 + [False] * 38
    assert all(isinstance(r, TooManyRequestsError) and r.code == "backlog_full"
               for r in results[2:])
    assert redis_client.xlen(keys.partition_stream(3)) == 2

    spread = [new_task(b"s%d" % i) for i in range(40)]
    for index, task in enumerate(spread):
        task.task_id = keys.new_task_id(4 + index % 4, PARTITIONS)
    calls = store.admissions.calls
    records = await asyncio.gather(*(store.admit(t, pending(t)) for t in spread))
    assert all(a.record.status is Status.PENDING for a in records)
    assert store.admissions.calls - calls == (8 if REDIS_CLUSTER else 2)
    for partition in range(4, 8):
        assert redis_client.xlen(keys.partition_stream(partition)) == 10
    assert all(redis_client.hget(keys.task_key(t.task_id, keys.partition_of(t.task_id, PARTITIONS)),
                                 "status") == b"PENDING" for t in spread)


async def test_an_admission_that_fails_in_a_shared_call_fails_alone(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    """Three admissions of one partition in one call, the second's record key taken by a
    string (Redis refuses its HSET): it gets that error, the others are admitted."""
    tasks = [new_task(b"f%d" % i) for i in range(3)]
    for task in tasks:
        task.task_id = keys.new_task_id(5, PARTITIONS)
    broken = keys.task_key(tasks[1].task_id, 5)
    redis_client.set(broken, "not a hash")
    blocker = new_task(b"first")  # out while the three wait: they ride one call together
    blocker.task_id = keys.new_task_id(5, PARTITIONS)
    calls = store.admissions.calls
    first = asyncio.ensure_future(store.admit(blocker, pending(blocker)))
    await asyncio.sleep(0)
    results = await asyncio.gather(*(store.admit(t, pending(t)) for t in tasks),
                                   return_exceptions=True)
    await first
    assert store.admissions.calls - calls == 2
    assert isinstance(results[1], RedisCommandError) and "WRONGTYPE" in str(results[1])
    for index in (0, 2):
        assert isinstance(results[index], Admitted)
        assert redis_client.hget(keys.task_key(tasks[index].task_id, 5), "status") == b"PENDING"


async def test_a_stream_that_fails_to_settle_leaves_the_others_settled(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    """A batch over two partitions, one task's record replaced by a string: the completion
    answers Redis's error (the batcher settles again), and the other partition's tasks have
    their final records."""
    tasks = [new_task(b"g%d" % i) for i in range(4)]
    for index, task in enumerate(tasks):
        task.task_id = keys.new_task_id(6 + index % 2, PARTITIONS)
        await store.admit(task, pending(task))
    deliveries = read_entries(redis_client, tasks)
    redis_client.delete(keys.task_key(tasks[0].task_id, 6))  # the first stream settled
    redis_client.set(keys.task_key(tasks[0].task_id, 6), "not a hash")
    with pytest.raises(RedisCommandError, match="WRONGTYPE"):
        await store.complete([Completion(d, finished(d.task)) for d in deliveries if d.task])
    for task in (tasks[1], tasks[3]):  # partition 7's, after it in the call
        record = await store.read(task.task_id)
        assert record is not None and record.status is Status.SUCCESS


async def test_unknown_task_reads_as_none(store: RedisTaskStore) -> None:
    assert await store.read(keys.new_task_id()) is None


async def test_completion_writes_records_acks_and_deletes_entries_in_every_partition(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    tasks = [new_task(f"p{i}".encode()) for i in range(40)]  # over many partitions
    for task in tasks:
        await store.admit(task, pending(task))
    deliveries = read_entries(redis_client, tasks)
    before = calls_of(redis_client, "evalsha", "publish")
    written = await store.complete([Completion(d, finished(d.task, output={"n": i}))
                                    for i, d in enumerate(deliveries) if d.task])
    assert written == [True] * 40
    if not REDIS_CLUSTER:  # one script call for every partition, one announcement for the
        # process that made the ids (on a Cluster: one call per partition, in one round trip)
        assert calls_of(redis_client, "evalsha", "publish") == [n + 1 for n in before]
    for i, task in enumerate(tasks):
        record = await store.read(task.task_id)
        assert record is not None and record.status is Status.SUCCESS
        assert record.to_json()["output"] == {"n": i}
    assert stream_lengths(redis_client) == 0
    assert all(redis_client.xpending(keys.partition_stream(p), keys.CONSUMER_GROUP)["pending"]
               == 0 for p in range(PARTITIONS) if redis_client.exists(keys.partition_stream(p)))


async def test_the_first_final_answer_stands(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task()
    await store.admit(task, pending(task))
    delivery = read_entry(redis_client, task)
    assert await store.complete([Completion(delivery, finished(task, output="first"))]) == [True]
    again = await store.complete([Completion(delivery, finished(task, Status.FAILED,
                                                                error="second"),
                                             dead_letter="second")])
    assert again == [False]
    record = await store.read(task.task_id)
    assert record is not None and record.to_json()["output"] == "first"
    assert dead_letters(redis_client) == []  # a duplicate leaves no dead letter


def placed(task: Task, same: bool) -> Task:
    """A new task in the same partition as ``task`` (or, ``same`` False, in another)."""
    partition = keys.partition_of(task.task_id, PARTITIONS)
    while True:
        other = new_task(b"placed")
        if (keys.partition_of(other.task_id, PARTITIONS) == partition) is same:
            return other


async def test_a_task_past_its_deadline_expires_once_wherever_it_waits(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    """Unread, it leaves its stream and its count; read by a batcher, it is ended all the same
    and its count leaves once: the batcher's late answer is not written, its entry is
    acknowledged. A final record stays as it is; an unknown task is None."""
    held = new_task(b"held")
    unread, neighbour = placed(held, same=False), placed(held, same=True)
    await store.admit(held, pending(held))
    delivery = read_entry(redis_client, held)
    for task in (unread, neighbour):
        await store.admit(task, pending(task))
    for task in (unread, held):
        record = await store.expire(task.task_id)
        assert record is not None and record.status is Status.EXPIRED
        body = record.to_json()
        assert body["error"] == EXPIRED_ERROR and body["finished_at"] > 0
        assert await store.read(task.task_id) == record
    assert redis_client.xlen(keys.partition_stream(
        keys.partition_of(unread.task_id, PARTITIONS))) == 0
    assert backlog_counts(redis_client) == 1  # the neighbour's alone
    late = await store.complete([Completion(delivery, finished(held, output="late"))])
    assert late == [False]  # the first final record stands
    assert (await store.read(held.task_id)) == await store.expire(held.task_id)
    assert backlog_counts(redis_client) == 1  # not left twice
    assert redis_client.xpending(delivery.stream, keys.CONSUMER_GROUP)["pending"] == 0
    assert redis_client.xlen(delivery.stream) == 1  # the neighbour's entry, unread
    assert await store.expire(keys.new_task_id()) is None


async def test_a_failure_is_dead_lettered_in_its_partition_with_its_payload(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task(b"poison-payload")
    await store.admit(task, pending(task))
    delivery = read_entry(redis_client, task)
    await store.complete([Completion(delivery, finished(task, Status.FAILED, error="boom"),
                                     dead_letter="boom")])
    partition = keys.partition_of(task.task_id, PARTITIONS)
    entries: Any = redis_client.xrange(keys.dead_letter_stream(partition))
    assert len(entries) == 1
    letter = entries[0][1]
    assert letter[b"task_id"] == task.task_id.encode() and letter[b"error"] == b"boom"
    assert letter[b"task"] == encode_task(task)  # the payload is kept for inspection
    assert letter[b"stream"] == keys.partition_stream(partition).encode()
    assert letter[b"model"] == b"sim" and letter[b"deliveries"] == b"1"


async def test_an_unreadable_entry_is_dead_lettered_and_acknowledged(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    stream = keys.partition_stream(5)
    redis_client.xgroup_create(stream, keys.CONSUMER_GROUP, id="0", mkstream=True)
    redis_client.xadd(stream, {"task": b"\xff garbage"})
    reply: Any = redis_client.xreadgroup(keys.CONSUMER_GROUP, "t", {stream: ">"})
    entry_id = reply[0][1][0][0].decode()
    delivery = Delivery(5, stream, entry_id, b"\xff garbage", None, "undecodable")
    assert await store.complete([Completion(delivery, None, "undecodable")]) == [True]
    assert redis_client.xlen(stream) == 0
    # settled again (a retry after a lost reply): acknowledged already, so no second letter
    assert await store.complete([Completion(delivery, None, "undecodable")]) == [False]
    letters = dead_letters(redis_client)
    assert len(letters) == 1 and letters[0][b"task"] == b"\xff garbage"


async def test_completions_are_announced_with_small_bodies_inline(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    heard: list[bytes] = []
    sub = announcement_listener(store.client, redis_url, keys.done_channel(keys.process_tag()),
                                heard.append)
    await sub.start()
    try:
        assert await wait_until(sub.connected.is_set, 5)
        small, large = new_task(b"small"), new_task(b"large")
        for task in (small, large):
            await store.admit(task, pending(task))
        first, second = read_entries(redis_client, [small, large])
        await store.complete([Completion(first, finished(small, output="ok")),
                              Completion(second, finished(large, output="x" * 5000))])
        both = {small.task_id.encode(), large.task_id.encode()}
        assert await wait_until(lambda: {a.task_id for message in heard
                                         for a in announcements(message)} == both, 5)
    finally:
        await sub.stop()
    frames = {a.task_id: a.record for message in heard for a in announcements(message)}
    assert set(frames) == {small.task_id.encode(), large.task_id.encode()}
    inline = frames[small.task_id.encode()]
    assert isinstance(inline, StoredRecord) and inline.to_json()["output"] == "ok"
    assert frames[large.task_id.encode()] is None  # over the inline limit: read on demand


async def test_a_waiter_gets_a_large_result_by_reading_it(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    reads = Reads(store)
    waiters = ResultWaiters(reads)
    sub = announcement_listener(store.client, redis_url, keys.done_channel(keys.process_tag()),
                                waiters.on_announcement, waiters.wake_all)
    await sub.start()
    try:
        assert await wait_until(sub.connected.is_set, 5)
        task = new_task()
        await store.admit(task, pending(task))
        with waiters.watch(task.task_id) as watch:
            waiting = asyncio.create_task(watch.final(10))
            assert await wait_until(lambda: reads.statuses == [Status.PENDING], 5)  # it waits
            await store.complete([Completion(read_entry(redis_client, task),
                                             finished(task, output="y" * 5000))])
            record = await asyncio.wait_for(waiting, 5)
    finally:
        await sub.stop()
    assert record is not None and record.status is Status.SUCCESS
    assert record.to_json()["output"] == "y" * 5000
    assert reads.statuses == [Status.PENDING, Status.SUCCESS]  # woken, it read the record


class Reads:
    """The store's reads of records, as a waiter makes them: what each found."""

    def __init__(self, store: RedisTaskStore) -> None:
        self.store = store
        self.statuses: list[Status | None] = []

    async def __call__(self, task_id: str) -> StoredRecord | None:
        record = await self.store.read(task_id)
        self.statuses.append(record.status if record is not None else None)
        return record


async def listened(store: RedisTaskStore, redis_client: redis.Redis, channel: str,
                   timeout_s: float = 5.0) -> bool:
    """Whether Redis came to count one subscriber of ``channel`` (on a cluster, of every
    partition's copy of it, each on its master) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if isinstance(store.client, ClusterClient):
            counts = []
            for partition in range(PARTITIONS):
                tag = keys.slot_tag(partition)
                owner = await store.client.node_of(tag)
                counts.append(int((await owner.execute("PUBSUB", "SHARDNUMSUB", channel + tag))[1]))
            if min(counts) == 1:
                return True
        elif redis_client.pubsub_numsub(channel)[0][1] == 1:
            return True
        await asyncio.sleep(0.05)
    return False


def tagged_task(tag: str, partition: int = 3) -> Task:
    """A task whose id another process (announcement tag ``tag``) could have made."""
    task_id = keys.new_task_id(partition, PARTITIONS)[:-keys.ANNOUNCE_TAG_LENGTH] + tag
    return Task(task_id=task_id, model="sim", payload=task_id.encode(),
                enqueued_at_ms=1_700_000_000_000)


def other_tag() -> str:
    return "beef" if keys.process_tag() != "beef" else "f00d"


async def test_each_process_hears_the_ends_of_its_own_tasks_only(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    """One batch of one partition finishes tasks of two processes: one message on each one's
    channel, with its own tasks only."""
    ours, theirs = new_task(b"ours"), tagged_task(other_tag())
    ours = tagged_task(keys.process_tag())
    heard: dict[str, list[bytes]] = {keys.process_tag(): [], other_tag(): []}
    subs = [announcement_listener(store.client, redis_url, keys.done_channel(tag),
                                  heard[tag].append) for tag in heard]
    for sub in subs:
        await sub.start()
    try:
        assert await wait_until(lambda: all(s.connected.is_set() for s in subs), 5)
        for task in (ours, theirs):
            await store.admit(task, pending(task))
        await store.complete([Completion(d, finished(t, output="ok")) for d, t in zip(
            read_entries(redis_client, [ours, theirs]), (ours, theirs), strict=True)])
        fences = {tag: await fence(store.client, keys.done_channel(tag), sharded=True)
                  for tag in heard}  # past them, nothing more of the batch can arrive
        assert await wait_until(lambda: all(heard[tag].count(FENCE) == fences[tag]
                                            for tag in heard), 5)
    finally:
        for sub in subs:
            await sub.stop()
    heard = {tag: [m for m in messages if m != FENCE] for tag, messages in heard.items()}
    names = {tag: [a.task_id.decode() for m in messages for a in announcements(m)]
             for tag, messages in heard.items()}
    assert names == {keys.process_tag(): [ours.task_id], other_tag(): [theirs.task_id]}
    assert len(heard[keys.process_tag()]) == 1


async def test_a_wait_for_another_processs_task_listens_on_its_channel(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    """A GET that lands on another gateway process: it subscribes to the admitting process's
    channel, and is woken by the end announced there."""
    waiters: ResultWaiters

    def heard(message: bytes) -> None:  # late bound: the waiters are made with their channel
        waiters.on_announcement(message)

    def lost() -> None:
        waiters.wake_all()

    sub = announcement_listener(store.client, redis_url, keys.done_channel(keys.process_tag()),
                                heard, lost)
    reads = Reads(store)
    waiters = ResultWaiters(reads, sub)
    await sub.start()
    try:
        assert await wait_until(sub.connected.is_set, 5)
        task = tagged_task(other_tag())
        await store.admit(task, pending(task))
        with waiters.watch(task.task_id) as watch:
            waiting = asyncio.create_task(watch.final(30))
            assert await listened(store, redis_client, keys.done_channel(other_tag()))
            # confirmed, it read the record, and waits
            assert await wait_until(lambda: reads.statuses == [Status.PENDING], 5)
            await store.complete([Completion(read_entry(redis_client, task),
                                             finished(task, output="theirs"))])
            record = await asyncio.wait_for(waiting, 10)  # PENDING if it never heard the end
    finally:
        await sub.stop()
    assert record is not None and record.status is Status.SUCCESS
    assert record.to_json()["output"] == "theirs"


async def announced(store: RedisTaskStore, admin: redis.Redis, task: Task,
                    address: RedisAddress) -> dict[str, list[bytes]]:
    """What the task's end was announced on: its process's plain channel and its partition's
    sharded copy of it, each heard by a subscriber of its own."""
    tag, partition = keys.announce_tag(task.task_id), keys.partition_of(task.task_id, PARTITIONS)
    heard: dict[str, list[bytes]] = {"plain": [], "sharded": []}
    subs = [Subscriber(address, keys.done_channel(tag), heard["plain"].append, lambda: None),
            Subscriber(address, keys.done_shard_channel(tag, partition), heard["sharded"].append,
                       lambda: None, sharded=True)]
    for sub in subs:
        await sub.start()
    try:
        assert await wait_until(lambda: all(s.connected.is_set() for s in subs), 5)
        await store.admit(task, pending(task))
        assert await store.complete([Completion(read_entry(admin, task),
                                                finished(task, output="ok"))]) == [True]
        fenced = fence_both(admin, tag, partition)  # past them, nothing more can arrive
        assert await wait_until(lambda: all(FENCE in heard[name] for name in fenced), 5)
    finally:
        for sub in subs:
            await sub.stop()
    return {name: [m for m in messages if m != FENCE] for name, messages in heard.items()}


def fence_both(admin: redis.Redis, tag: str, partition: int) -> list[str]:
    """``FENCE`` on a task's plain channel and on its partition's sharded copy (see
    ``helpers.fence``): the names of those it went to. Where Redis has no SPUBLISH, nothing
    can be sent on the sharded copy at all."""
    admin.publish(keys.done_channel(tag), FENCE)
    try:
        admin.spublish(keys.done_shard_channel(tag, partition), FENCE)
    except redis.ResponseError:  # unknown command
        return ["plain"]
    return ["plain", "sharded"]


@pytest.mark.single_redis
async def test_a_sharded_store_announces_in_its_partitions_slot_only(
    redis_url: str, redis_client: redis.Redis,
) -> None:
    """On a cluster the scripts SPUBLISH on the partition's copy of the channel (the same
    scripts, told the partition's hash tag; a single Redis 7 speaks sharded Pub/Sub too)."""
    client = lean(CommonSettings(redis_url=redis_url), "test")
    store = RedisTaskStore(client, partitions=PARTITIONS, result_ttl_s=60, pending_ttl_s=600,
                           sharded=True)
    try:
        heard = await announced(store, redis_client, tagged_task(keys.process_tag(), 5),
                                RedisAddress.from_url(redis_url))
    finally:
        await client.close()
    assert len(heard["sharded"]) == 1 and heard["plain"] == []


@pytest.mark.single_redis
async def test_a_redis_without_spublish_gets_the_announcement_on_the_plain_channel(
    tmp_path: Path,
) -> None:
    """Redis before 7.0 has no SPUBLISH (here: renamed away). The completion script has
    written the record by then and must not fail: it announces on the plain channel, which
    the admitting gateway process also hears."""
    proc, url = start_redis(tmp_path, extra=("--rename-command", "SPUBLISH", ""))
    admin = redis.Redis.from_url(url)
    client = lean(CommonSettings(redis_url=url), "test")
    try:
        store = RedisTaskStore(client, partitions=PARTITIONS, result_ttl_s=60,
                               pending_ttl_s=600, sharded=True)
        task = tagged_task(keys.process_tag(), 5)
        heard = await announced(store, admin, task, RedisAddress.from_url(url))
        record = await store.read(task.task_id)
    finally:
        await client.close()
        proc.stop(grace_s=5)
    assert len(heard["plain"]) == 1 and heard["sharded"] == []
    assert record is not None and record.status is Status.SUCCESS

