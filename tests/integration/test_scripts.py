"""Each of the task store's Lua scripts, run against a real Redis through ``RedisTaskStore``:
admission (queued, each refusal, a cache hit, a collapse, the doorbell), completion (dead
letters, the cached answer, followers, webhooks, counts clamped at none; that the first answer
stands is in test_task_store.py),
cancellation (every outcome) and healing of the backlog counts."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis

from ferry import keys
from ferry.codec import dumps, encode_task
from ferry.errors import TooManyRequestsError
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.redis_conn import lean
from ferry.resp.client import RedisAddress
from ferry.resp.subscriber import Subscriber
from ferry.settings import CommonSettings
from ferry.tasks.base import (
    Admission,
    CancelOutcome,
    Completion,
    Owner,
    Sharing,
    input_digest,
)
from ferry.tasks.record import (
    CANCELLED_ERROR,
    Announcement,
    Status,
    TaskRecord,
    announcements,
    reusable,
)
from ferry.tasks.redis_store import RedisTaskStore
from ferry.v1.task_pb2 import Task
from tests.conftest import REDIS_CLUSTER
from tests.integration.helpers import FENCE, announcement_listener, fence, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
PARTITIONS = 4
CACHE_TTL_S = 300
PENDING_TTL_S = 600
CREATED = 1_700_000_000.125
ALICE, BOB = Owner("alice"), Owner("bob")


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisTaskStore]:
    client = lean(CommonSettings(redis_url=redis_url, redis_cluster=REDIS_CLUSTER), "test")
    yield RedisTaskStore(client, partitions=PARTITIONS, result_ttl_s=60,
                         pending_ttl_s=PENDING_TTL_S, inline_limit=1024,
                         cache_ttl_s=CACHE_TTL_S)
    await client.close()


@contextlib.asynccontextmanager
async def listening(redis_url: str, store: RedisTaskStore,
                    channel: str = keys.done_channel(keys.process_tag()), *,
                    plain: bool = False) -> AsyncIterator[list[bytes]]:
    """Every message the store's scripts publish on ``channel`` while the block runs, heard as
    its announcements are (every partition's copy, on a Redis Cluster), or (``plain``) on the
    channel itself: after the block, up to a fence (``helpers.fence``), past which nothing
    published in the block can still be on its way."""
    heard: list[bytes] = []
    sub = (Subscriber(RedisAddress.from_url(redis_url), channel, heard.append, lambda: None)
           if plain else announcement_listener(store.client, redis_url, channel, heard.append))
    await sub.start()
    try:
        assert await wait_until(sub.connected.is_set, 5)
        yield heard
        fences = await fence(store.client, channel, sharded=not plain)
        assert await wait_until(lambda: heard.count(FENCE) == fences, 5)
        heard[:] = [message for message in heard if message != FENCE]
    finally:
        await sub.stop()


def heard_announcements(heard: list[bytes]) -> dict[str, Announcement]:
    return {a.task_id.decode(): a for message in heard for a in announcements(message)}


DIGEST = input_digest("sim", "1", b"same input")
SHARED = Sharing(DIGEST, lookup=True, collapse=True)


def new_task(*, shared: bool = False, priority: Priority = Priority.NORMAL,
             callback: str = "", partition: int = 0) -> Task:
    if shared:
        partition = keys.partition_of_digest(DIGEST, PARTITIONS)
    return Task(task_id=keys.new_task_id(partition, PARTITIONS), model="sim",
                payload=b"same input" if shared else b"data",
                enqueued_at_ms=int(CREATED * 1000), priority=int(priority),
                input_digest=DIGEST if shared else "", digest_version="1" if shared else "",
                callback_url=callback)


def pending(task: Task) -> TaskRecord:
    return TaskRecord.pending(task, CREATED)


def final(task: Task, status: Status = Status.SUCCESS, **fields: Any) -> Completion:
    """A completion of a delivery read later (see ``settle``)."""
    record = TaskRecord.final(task, status, CREATED + 1, **fields)
    version = fields.get("model_version", "")
    letter = fields.get("error") if status is Status.FAILED else None
    return Completion(Delivery(0, "", "", b"", task), record, letter,
                      reusable(task, status, version, None))


def read(client: redis.Redis, task: Task) -> Delivery:
    """Take the task's entry through the consumer group, as a batcher would."""
    partition = keys.partition_of(task.task_id, PARTITIONS)
    stream = keys.partition_stream(partition, Priority.of(task.priority))
    with contextlib.suppress(redis.ResponseError):  # BUSYGROUP
        client.xgroup_create(stream, keys.CONSUMER_GROUP, id="0")
    reply: Any = client.xreadgroup(keys.CONSUMER_GROUP, "tester", {stream: ">"})
    for _, entries in reply:
        for entry_id, fields in entries:
            if fields.get(keys.TASK_FIELD.encode()) == encode_task(task):
                return Delivery(partition, stream, entry_id.decode(), encode_task(task), task)
    raise AssertionError(f"no entry for {task.task_id}")


async def settle(store: RedisTaskStore, client: redis.Redis, *completions: Completion
                 ) -> list[bool]:
    """Complete each task through its real delivery."""
    real = []
    for c in completions:
        assert c.delivery.task is not None
        real.append(Completion(read(client, c.delivery.task), c.record, c.dead_letter,
                               c.reusable))
    return await store.complete(real)


def record_of(client: redis.Redis, task: Task) -> dict[bytes, bytes]:
    partition = keys.partition_of(task.task_id, PARTITIONS)
    fields: Any = client.hgetall(keys.task_key(task.task_id, partition))
    return dict(fields)


def backlog(client: redis.Redis, task: Task, field: str | None = None) -> int:
    partition = keys.partition_of(task.task_id, PARTITIONS)
    name = field or keys.backlog_field(task.model, Priority.of(task.priority))
    return int(client.hget(keys.backlog_key(partition), name) or 0)


def webhooks(client: redis.Redis, partition: int) -> list[bytes]:
    entries: Any = client.xrange(keys.webhook_stream(partition))
    return [fields[b"task_id"] for _, fields in entries]


# --- admit --------------------------------------------------------------------------------------


async def test_a_queued_task_has_its_record_entry_and_count(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task(partition=1)
    admitted = await store.admit(task, pending(task))
    assert admitted.how == "queued" and admitted.record.body == pending(task).body()
    fields = record_of(redis_client, task)
    assert fields[b"status"] == b"PENDING" and fields[b"body"] == pending(task).body()
    assert redis_client.xlen(keys.partition_stream(1)) == 1
    assert backlog(redis_client, task) == 1


@pytest.mark.parametrize("refusal", ["backlog_full", "deadline_unmeetable", "too_many_pending"])
async def test_each_refusal_writes_nothing(
    store: RedisTaskStore, redis_client: redis.Redis, refusal: str,
) -> None:
    admission, owner = Admission(), Owner()
    if refusal == "backlog_full":
        admission = Admission(limit=PARTITIONS, partitions=PARTITIONS)  # 1 per partition
    elif refusal == "deadline_unmeetable":
        admission = Admission(rate=PARTITIONS / 0.85, batch_s=0.1, timeout_s=1.0,
                              partitions=PARTITIONS)  # 1 task/s per partition
    else:
        owner = Owner("alice", max_pending=PARTITIONS)
    first, second = new_task(partition=2), new_task(partition=2)
    await store.admit(first, pending(first), admission, owner=owner)
    with pytest.raises(TooManyRequestsError) as refused:
        await store.admit(second, pending(second), admission, owner=owner)
    assert refused.value.code == refusal
    assert record_of(redis_client, second) == {}
    assert redis_client.xlen(keys.partition_stream(2)) == 1
    assert backlog(redis_client, first) == 1


async def test_an_owners_tasks_are_counted_and_kept_on_the_record(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    owner = Owner("alice", max_pending=10)
    task = new_task()
    await store.admit(task, pending(task), owner=owner)
    assert backlog(redis_client, task, owner.field) == 1
    assert record_of(redis_client, task)[b"owner"] == b"alice"


async def test_a_priority_other_than_normal_rings_the_doorbell_once_per_period(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    for _ in range(2):
        task = new_task(priority=Priority.HIGH, partition=3)
        await store.admit(task, pending(task))
    entries: Any = redis_client.xrange(keys.partition_stream(3))
    assert [fields for _, fields in entries] == [{keys.BELL_FIELD.encode(): b"1"}]
    assert redis_client.xlen(keys.partition_stream(3, Priority.HIGH)) == 2
    quiet = new_task(partition=3)
    await store.admit(quiet, pending(quiet))
    assert redis_client.xlen(keys.partition_stream(3)) == 2  # a normal task's entry, no bell


async def test_a_reusable_answer_is_a_cache_hit_with_its_own_head(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    first = new_task(shared=True)
    await store.admit(first, pending(first), sharing=SHARED)
    await settle(store, redis_client, final(first, output={"y": 1}, model_version="1"))
    repeat = new_task(shared=True, priority=Priority.HIGH, callback="https://example.com/h")
    admitted = await store.admit(repeat, pending(repeat), sharing=SHARED, owner=BOB)
    expected = TaskRecord(repeat.task_id, Status.SUCCESS, "sim", CREATED, "1", CREATED,
                          {"y": 1}, cache="hit").body()
    assert admitted.how == "hit" and admitted.record.body == expected
    assert record_of(redis_client, repeat)[b"body"] == expected
    partition = keys.partition_of_digest(DIGEST, PARTITIONS)
    assert redis_client.xlen(keys.partition_stream(partition, Priority.HIGH)) == 0
    assert webhooks(redis_client, partition) == [repeat.task_id.encode()]


async def test_an_identical_task_in_flight_is_followed(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    leader, follower = new_task(shared=True), new_task(shared=True)
    await store.admit(leader, pending(leader), sharing=SHARED, owner=ALICE)
    admitted = await store.admit(follower, pending(follower), sharing=SHARED, owner=ALICE)
    assert admitted.how == "collapsed" and admitted.record.body == pending(follower).body()
    partition = keys.partition_of_digest(DIGEST, PARTITIONS)
    listed: Any = redis_client.lrange(keys.followers_key(partition, leader.task_id), 0, -1)
    created = dumps(pending(follower).created_at)  # the format every version reads
    assert listed == [follower.task_id.encode() + b" " + created + b" alice"]
    assert backlog(redis_client, leader) == 1  # the follower costs no backlog
    assert record_of(redis_client, follower)[b"leader"] == leader.task_id.encode()


async def test_a_task_with_a_deadline_is_not_followed(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    leader = new_task(shared=True)
    await store.admit(leader, pending(leader), sharing=Sharing(DIGEST, lookup=True))
    other = new_task(shared=True)
    assert (await store.admit(other, pending(other), sharing=SHARED)).how == "queued"


# --- complete (that the first answer stands: test_task_store.py) ---------------------------------


async def test_a_failure_is_dead_lettered_and_its_counts_clamped_at_none(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    owner = Owner("alice", max_pending=10)
    task = new_task(callback="https://example.com/hook")
    await store.admit(task, pending(task), owner=owner)
    redis_client.hset(keys.backlog_key(0), keys.backlog_field("sim", Priority.NORMAL), 0)
    async with listening(redis_url, store=store) as heard:
        await settle(store, redis_client, final(task, Status.FAILED, error="boom"))
    assert backlog(redis_client, task) == 0 and backlog(redis_client, task, owner.field) == 0
    letters: Any = redis_client.xrange(keys.dead_letter_stream(0))
    (_, letter), = letters
    assert letter[b"error"] == b"boom" and letter[b"model"] == b"sim"
    assert letter[b"task"] == encode_task(task) and letter[b"task_id"] == task.task_id.encode()
    assert webhooks(redis_client, 0) == [task.task_id.encode()]
    body = TaskRecord.final(task, Status.FAILED, CREATED + 1, error="boom").body()
    assert heard_announcements(heard)[task.task_id] == Announcement(
        task.task_id.encode(), Status.FAILED, body)


async def test_a_reusable_answer_keeps_its_place_and_its_digest_key(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task(shared=True)
    await store.admit(task, pending(task), sharing=SHARED)
    completion = final(task, output=[1, 2], model_version="1")
    await settle(store, redis_client, completion)
    assert completion.record is not None
    encoded = completion.record.encode()
    fields = record_of(redis_client, task)
    assert fields[b"answer"] == f"{encoded.answer_at + 1} {len(encoded.body)}".encode()
    partition = keys.partition_of_digest(DIGEST, PARTITIONS)
    assert 0 < int(redis_client.ttl(keys.cache_key(partition, DIGEST))) <= CACHE_TTL_S


async def test_an_answer_that_is_not_reusable_drops_the_digest_key(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task(shared=True)
    await store.admit(task, pending(task), sharing=SHARED)
    await settle(store, redis_client, final(task, output=[1], model_version="2"))  # not "1"
    assert b"answer" not in record_of(redis_client, task)
    partition = keys.partition_of_digest(DIGEST, PARTITIONS)
    assert not redis_client.exists(keys.cache_key(partition, DIGEST))


async def test_followers_end_as_their_leader_did_and_only_its_owners_are_named(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    leader, own, other = (new_task(shared=True), new_task(shared=True),
                          new_task(shared=True, callback="https://example.com/bob"))
    await store.admit(leader, pending(leader), sharing=SHARED, owner=ALICE)
    await store.admit(own, pending(own), sharing=SHARED, owner=ALICE)
    await store.admit(other, pending(other), sharing=SHARED, owner=BOB)
    async with listening(redis_url, store=store) as heard:
        await settle(store, redis_client, final(leader, output={"y": 1}, model_version="1"))
    expected = [
        (own, TaskRecord(own.task_id, Status.SUCCESS, "sim", CREATED, "1", CREATED + 1,
                         {"y": 1}, collapsed_into=leader.task_id).body()),
        (other, TaskRecord(other.task_id, Status.SUCCESS, "sim", CREATED, "1", CREATED + 1,
                           {"y": 1}).body())]
    frames = heard_announcements(heard)
    for follower, body in expected:
        assert record_of(redis_client, follower)[b"body"] == body
        assert frames[follower.task_id].body == body
    partition = keys.partition_of_digest(DIGEST, PARTITIONS)
    assert webhooks(redis_client, partition) == [other.task_id.encode()]
    assert not redis_client.exists(keys.followers_key(partition, leader.task_id))


# --- cancel -------------------------------------------------------------------------------------


async def test_an_unknown_or_another_clients_task_is_unknown(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task()
    assert (await store.cancel(task.task_id)).outcome is CancelOutcome.UNKNOWN
    await store.admit(task, pending(task), owner=ALICE)
    found = await store.cancel(task.task_id, "bob")
    assert found.outcome is CancelOutcome.UNKNOWN and found.record is None
    assert record_of(redis_client, task)[b"status"] == b"PENDING"


async def test_a_final_task_is_answered_with_its_record(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    task = new_task()
    await store.admit(task, pending(task))
    completion = final(task, output="done")
    await settle(store, redis_client, completion)
    found = await store.cancel(task.task_id)
    assert found.outcome is CancelOutcome.FINAL and found.record is not None
    assert completion.record is not None and found.record.body == completion.record.body()


async def test_an_unread_task_is_cancelled_at_once(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    task = new_task(priority=Priority.LOW, callback="https://example.com/h")
    await store.admit(task, pending(task), owner=Owner("alice", max_pending=9))
    async with listening(redis_url, store=store) as heard:
        found = await store.cancel(task.task_id, "alice")
    assert found.outcome is CancelOutcome.CANCELLED and found.record is not None
    record = orjson.loads(found.record.body)
    expected = TaskRecord(task.task_id, Status.CANCELLED, "sim", CREATED,
                          finished_at=record["finished_at"], error=CANCELLED_ERROR,
                          priority="low").body()
    assert found.record.body == expected == record_of(redis_client, task)[b"body"]
    assert redis_client.xlen(keys.partition_stream(0, Priority.LOW)) == 0
    assert backlog(redis_client, task) == 0 and backlog(redis_client, task, "@alice") == 0
    assert heard_announcements(heard)[task.task_id].body == expected
    assert webhooks(redis_client, 0) == [task.task_id.encode()]


async def test_a_task_a_batcher_holds_is_signalled(
    store: RedisTaskStore, redis_client: redis.Redis, redis_url: str,
) -> None:
    task = new_task()
    await store.admit(task, pending(task))
    read(redis_client, task)
    async with listening(redis_url, store, keys.CANCEL_CHANNEL, plain=True) as heard:
        found = await store.cancel(task.task_id)
    assert found.outcome is CancelOutcome.SIGNALLED and found.record is None
    assert heard == [task.task_id.encode()]
    assert await store.cancel_requested([task.task_id]) == [True]
    assert record_of(redis_client, task)[b"status"] == b"PENDING"


async def test_a_followed_task_is_shared_and_a_follower_leaves_its_leader(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    leader, follower, stays = (new_task(shared=True) for _ in range(3))
    for task in (leader, follower, stays):
        await store.admit(task, pending(task), sharing=SHARED)
    assert (await store.cancel(leader.task_id)).outcome is CancelOutcome.SHARED
    found = await store.cancel(follower.task_id)
    assert found.outcome is CancelOutcome.CANCELLED and found.record is not None
    assert orjson.loads(found.record.body)["status"] == "CANCELLED"
    partition = keys.partition_of_digest(DIGEST, PARTITIONS)
    listed: Any = redis_client.lrange(keys.followers_key(partition, leader.task_id), 0, -1)
    assert [entry.split()[0] for entry in listed] == [stays.task_id.encode()]


# --- heal ---------------------------------------------------------------------------------------


async def test_heal_resets_counts_only_when_every_stream_is_empty(
    store: RedisTaskStore, redis_client: redis.Redis,
) -> None:
    low = new_task(priority=Priority.LOW, partition=1)
    await store.admit(low, pending(low))
    redis_client.hset(keys.backlog_key(2), "sim|0", 5)  # a lost count, nothing queued
    assert await store.heal_backlog([1, 2]) == 1
    assert backlog(redis_client, low) == 1  # its entry is still queued
    assert not redis_client.exists(keys.backlog_key(2))
    holding = [s for s in keys.partition_streams(1) if redis_client.xlen(s)]
    assert len(holding) == 2  # its entry, and the doorbell it rang
    for stream in holding:  # counts stay while any stream holds an entry
        assert await store.heal_backlog([1]) == 0
        entries: Any = redis_client.xrange(stream)
        redis_client.xdel(stream, *(entry_id for entry_id, _ in entries))
    assert await store.heal_backlog([1]) == 1
    assert backlog(redis_client, low) == 0
