"""The Lua scripts of the rooms besides the task store (whose scripts test_scripts.py runs),
against a real Redis (and, in ``make test-cluster``, a 3-master cluster), through the code that
calls them and the typed results they answer: the job's fenced steps and moves, idempotency
keys, the rate limit, the queue's touch and the batchers' leases, a rollout's change and a
webhook's end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from ferry import keys, lua
from ferry.auth.rate_limit import Rate, RateLimiter
from ferry.batcher.webhooks import DONE, Done, DoneArgs, DoneKeys
from ferry.errors import RateLimitedError
from ferry.jobs import scripts as job_scripts
from ferry.jobs.model import ItemStatus, JobStatus
from ferry.jobs.scripts import Fence, ReleaseArgs, ReleaseKeys, job_keys
from ferry.jobs.store import JobStore, NewJob
from ferry.queue.base import Delivery
from ferry.queue.redis_streams import TOUCH_OWN, RedisStreamQueue, TouchArgs, TouchItem, TouchKeys
from ferry.redis_conn import text
from ferry.resp.client import Commands, RedisAddress, RespClient
from ferry.resp.cluster import ClusterClient
from ferry.rollouts.rollout import Rollout
from ferry.rollouts.store import RolloutStore
from ferry.tasks.idempotency import Claimed, IdempotencyKeys, redis_key
from tests.conftest import REDIS_CLUSTER

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
IDLE_MS = 100_000  # an idle time no entry reaches in a test


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Commands]:
    """Ferry's own client (EVALSHA; on a cluster, routed by slot)."""
    address = RedisAddress.from_url(redis_url)
    lean: Commands = ClusterClient(address) if REDIS_CLUSTER else RespClient(address)
    yield lean
    await lean.close()


async def new_job(store: JobStore) -> str:
    job_id = keys.new_job_id()
    await store.create(NewJob(job_id, "sim", total=4, client_id="alice", priority=1,
                              expires_at=0.0), "batch")
    return job_id


async def test_a_jobs_lease_fences_every_step(client: Commands) -> None:
    store = JobStore(client, record_ttl_s=60)
    job_id = await new_job(store)
    assert await store.lease(job_id, "a", 60_000)
    assert await store.lease(job_id, "a", 60_000)  # kept
    assert not await store.lease(job_id, "b", 60_000)
    assert not await store.lease(keys.new_job_id(), "a", 60_000)  # no such job
    assert await store.set_fenced(job_id, "a", reason="r", attempts=2)
    assert not await store.set_fenced(job_id, "b", reason="lost")
    assert await store.fly(job_id, "a", [(0, "t0", 0), (1, "t1", 10)], cursor=2, offset=20)
    assert not await store.fly(job_id, "b", [(2, "t2", 20)], cursor=3, offset=30)
    assert await store.flight(job_id) == {0: ("t0", 0), 1: ("t1", 10)}
    fields = await store.fields(job_id)
    assert fields is not None
    assert (fields["reason"], fields["attempts"], fields["cursor"], fields["offset"]) == (
        "r", "2", "2", "20")


async def test_a_commit_counts_each_item_once_and_a_retry_forgets_it(
        client: Commands) -> None:
    store = JobStore(client, record_ttl_s=60)
    job_id = await new_job(store)
    assert await store.lease(job_id, "a", 60_000)
    assert await store.fly(job_id, "a", [(0, "t0", 0), (1, "t1", 10)], cursor=2, offset=20)
    ended = [(0, ItemStatus.SUCCEEDED), (1, ItemStatus.FAILED)]
    assert await store.commit(job_id, "a", "seg-1", ended)
    assert await store.commit(job_id, "a", "", ended)  # again: counted once, no segment
    assert not await store.commit(job_id, "b", "seg-x", ended)
    assert await store.segments(job_id) == ["seg-1"]
    assert await store.flight(job_id) == {}
    record = await store.read(job_id)
    assert record is not None
    assert (record.counts.succeeded, record.counts.failed) == (1, 1)
    assert await store.done_bits(job_id) == b"\xc0"
    assert not await store.forget_done(job_id, "b", [1], ItemStatus.FAILED)
    assert await store.forget_done(job_id, "a", [1], ItemStatus.FAILED)
    record = await store.read(job_id)
    assert record is not None
    assert (record.counts.succeeded, record.counts.failed) == (1, 0)
    assert await store.done_bits(job_id) == b"\x80"
    fields = await store.fields(job_id)
    assert fields is not None
    assert (fields["cursor"], fields["offset"], fields["retry"]) == ("0", "0", "")


async def test_a_lease_released_only_by_its_holder(client: Commands) -> None:
    store = JobStore(client, record_ttl_s=60)
    job_id = await new_job(store)
    release = client.register_script(lua.source(job_scripts.RELEASE))
    assert await store.lease(job_id, "a", 60_000)
    names = job_keys(ReleaseKeys, job_id)
    assert job_scripts.fence(await client.execute(*release.command(
        names, ReleaseArgs(token="b")))) is Fence.LOST
    assert not await store.lease(job_id, "b", 60_000)
    assert job_scripts.fence(await client.execute(*release.command(
        names, ReleaseArgs(token="a")))) is Fence.HELD
    await store.release(job_id, "a")  # not held any more: nothing happens
    assert await store.lease(job_id, "b", 60_000)


async def test_a_job_moves_only_from_the_states_it_may_leave(client: Commands) -> None:
    store = JobStore(client, record_ttl_s=60)
    job_id = await new_job(store)
    await store.note(job_id, "waiting for capacity")
    before = await store.move(job_id, [JobStatus.QUEUED], JobStatus.RUNNING, started="1")
    assert before is JobStatus.QUEUED
    fields = await store.fields(job_id)
    assert fields is not None
    assert fields["status"] == "running" and fields["started"] == "1"
    assert "at:running" in fields and "note" not in fields
    assert await store.move(job_id, [JobStatus.QUEUED], JobStatus.FAILED) is JobStatus.RUNNING
    record = await store.read(job_id)
    assert record is not None and record.status is JobStatus.RUNNING
    assert await store.move(keys.new_job_id(), [JobStatus.QUEUED], JobStatus.RUNNING) is None


async def test_an_idempotency_key_is_claimed_once_and_swapped_only_by_its_holder(
        client: Commands, redis_client: redis.Redis) -> None:
    idem = IdempotencyKeys(client, ttl_s=600)
    key = redis_key("alice", "order-1")
    assert await idem.claim(key, "t1", "d1") is None
    assert await idem.claim(key, "t2", "d2") == Claimed("t1", "d1")
    assert not await idem.replace(key, Claimed("t9", "d9"), "t2", "d2")
    assert await idem.replace(key, Claimed("t1", "d1"), "t2", "d2")
    await idem.release(key, "t1", "d1")  # no longer its: left alone
    await idem.confirm(key, "t2", "d2")
    assert await idem.claim(key, "t3", "d3") == Claimed("t2", "d2", admitted=True)
    assert 0 < redis_client.ttl(key) <= 600  # the swaps kept it
    other = redis_key("alice", "order-2")
    assert await idem.claim(other, "t4", "d4") is None
    await idem.release(other, "t4", "d4")
    assert redis_client.exists(other) == 0


async def test_the_rate_script_allows_a_burst_then_limits(client: Commands) -> None:
    limiter = RateLimiter(client, Rate.of(60, 2), {})
    first = dict(await limiter.check("alice"))
    second = dict(await limiter.check("alice"))
    assert (first[b"ratelimit-remaining"], second[b"ratelimit-remaining"]) == (b"1", b"0")
    assert first[b"ratelimit-reset"] == b"1"
    with pytest.raises(RateLimitedError) as refused:
        await limiter.check("alice")
    assert 0.9 < refused.value.retry_after_s <= 1.0
    assert dict(refused.value.limit_headers)[b"ratelimit-reset"] == b"2"
    assert await RateLimiter(client, Rate.of(60, 2), {"bob": Rate(0, 0)}).check("bob") == []


def held_by_two(redis_client: redis.Redis, stream: str) -> list[str]:
    """Three entries read by "mine"; the third then taken by "other"; all idle for long."""
    ids = [text(redis_client.xadd(stream, {keys.TASK_FIELD: f"x{i}".encode()}))
           for i in range(3)]
    redis_client.xreadgroup(keys.CONSUMER_GROUP, "mine", {stream: ">"})
    redis_client.xclaim(stream, keys.CONSUMER_GROUP, "other", 0, [ids[2]], idle=IDLE_MS,
                        justid=True)
    redis_client.xclaim(stream, keys.CONSUMER_GROUP, "mine", 0, [*ids[:2]], idle=IDLE_MS,
                        justid=True)
    return ids


async def test_touch_resets_only_the_entries_the_consumer_still_owns(
        client: Commands, redis_client: redis.Redis) -> None:
    queue = RedisStreamQueue(client, client, partitions=1, owned=[0], consumer="mine")
    await queue.ensure_groups()
    stream = keys.partition_stream(0)
    ids = held_by_two(redis_client, stream)
    await queue.touch([(stream, ids[0])])
    touch = client.register_script(lua.source(TOUCH_OWN))
    touched = await client.execute(*touch.command(TouchKeys(stream=stream), [
        *TouchArgs(group=keys.CONSUMER_GROUP, consumer="mine"),
        *lua.items(TouchItem(entry_id) for entry_id in ids[1:])]))
    assert touched == 1  # the other consumer's entry is left to it
    rows = redis_client.xpending_range(stream, keys.CONSUMER_GROUP, "-", "+", 10)
    idle = {text(row["message_id"]): (text(row["consumer"]), int(row["time_since_delivered"]))
            for row in rows}
    assert idle[ids[0]][1] < IDLE_MS and idle[ids[1]][1] < IDLE_MS
    assert idle[ids[2]][0] == "other" and idle[ids[2]][1] >= IDLE_MS
    assert {row["times_delivered"] for row in rows} == {1}  # JUSTID: counts left alone


async def test_release_puts_back_as_new_only_the_entries_the_consumer_still_holds(
        client: Commands, redis_client: redis.Redis) -> None:
    queue = RedisStreamQueue(client, client, partitions=1, owned=[0], consumer="mine")
    await queue.ensure_groups()
    stream = keys.partition_stream(0)
    ids = held_by_two(redis_client, stream)
    await queue.release([Delivery(0, stream, entry_id, f"x{i}".encode(), None)
                         for i, entry_id in enumerate(ids)])
    rows = redis_client.xpending_range(stream, keys.CONSUMER_GROUP, "-", "+", 10)
    assert [(text(r["message_id"]), text(r["consumer"])) for r in rows] == [(ids[2], "other")]
    entries: Any = redis_client.xrange(stream)
    assert [fields[keys.TASK_FIELD.encode()] for _, fields in entries] == [b"x2", b"x0", b"x1"]
    assert text(entries[1][0]) > ids[2]  # new entries, unread: the next read takes them
    read = await queue.read(10, 0)
    assert [d.raw for d in read] == [b"x0", b"x1"]


async def test_a_rollout_changes_only_from_the_generation_read(client: Commands,
                                                               redis_client: redis.Redis
                                                               ) -> None:
    store = RolloutStore(client)
    first = Rollout("sim", stable="1", candidate="2", share=10.0, generation=1)
    assert await store.change(None, first, {"action": "start"})
    second = Rollout("sim", stable="1", candidate="2", share=20.0, generation=2)
    assert await store.change(first, second, {"action": "step"})
    assert not await store.change(first, second, {"action": "step again"})  # stale
    found = await store.get("sim")
    assert found is not None and (found.share, found.generation) == (20.0, 2)
    assert [e["action"] for e in await store.log("sim")] == ["step", "start"]
    for generation in range(3, keys.ROLLOUT_LOG_LENGTH + 2):
        assert await store.change(None, Rollout("sim", generation=generation), {})
    assert redis_client.llen(keys.rollout_log_key("sim")) == keys.ROLLOUT_LOG_LENGTH


async def test_a_webhooks_outcome_joins_its_record_once_and_its_entry_goes(
        client: Commands, redis_client: redis.Redis) -> None:
    done = client.register_script(lua.source(DONE))
    task_id = keys.new_task_id(0, 1)
    task, stream = keys.task_key(task_id, 0), keys.webhook_stream(0)
    redis_client.hset(task, "body", b'{"task_id":"x"}')
    redis_client.xgroup_create(stream, keys.WEBHOOK_GROUP, id="0", mkstream=True)

    async def end(outcome: bytes) -> Done:
        entry = text(redis_client.xadd(stream, {"task_id": task_id}))
        redis_client.xreadgroup(keys.WEBHOOK_GROUP, "sender", {stream: ">"})
        return Done(int(await client.execute(*done.command(DoneKeys(task=task, stream=stream),
                                                           DoneArgs(group=keys.WEBHOOK_GROUP,
                                                                    entry_id=entry,
                                                                    outcome=outcome)))))

    assert await end(b'{"status":"delivered"}') is Done.NOTED
    assert await end(b'{"status":"failed"}') is Done.SKIPPED  # the first outcome stands
    assert redis_client.hget(task, "body") == b'{"task_id":"x","webhook":{"status":"delivered"}}'
    redis_client.delete(task)
    assert await end(b'{"status":"failed"}') is Done.SKIPPED  # the record has expired
    assert redis_client.xlen(stream) == 0
    assert redis_client.xpending(stream, keys.WEBHOOK_GROUP)["pending"] == 0


async def test_a_lease_run_out_names_its_batcher_dead_and_its_entries_go_to_one_rescuer(
        client: Commands, redis_client: redis.Redis) -> None:
    """Leases at Redis's clock: a batcher that stops beating is named dead by the others; its
    entries are taken over each by one rescuer, with their delivery counts, and once it holds
    nothing it leaves the group; a live batcher's entries are never taken."""
    dead, live, one, two = (RedisStreamQueue(client, client, partitions=1, owned=[0], consumer=c)
                            for c in ("dead", "live", "one", "two"))
    assert await dead.beat(200) == [] and await live.beat(200) == []
    beaten = time.monotonic()
    await dead.ensure_groups()
    stream = keys.partition_stream(0)
    ids = [text(redis_client.xadd(stream, {keys.TASK_FIELD: b"t"})) for _ in range(5)]
    redis_client.xreadgroup(keys.CONSUMER_GROUP, "dead", {stream: ">"}, count=3)
    redis_client.xreadgroup(keys.CONSUMER_GROUP, "live", {stream: ">"}, count=2)
    named: list[str] = []
    while not named and time.monotonic() - beaten < 2.0:  # the test's subject: a lease of
        await asyncio.sleep(0.04)  # 200 ms running out, while the other beats
        named = await live.beat(200)
    assert named == ["dead"]
    assert time.monotonic() - beaten >= 0.2
    first, left = await one.rescue("dead", room=2)
    second, rest = await two.rescue("dead", room=10)
    assert ([d.entry_id for d in first], left) == (ids[:2], True)
    assert ([d.entry_id for d in second], rest) == ([ids[2]], False)
    assert {d.deliveries for d in first + second} == {2}
    owners = {text(r["message_id"]): text(r["consumer"])
              for r in redis_client.xpending_range(stream, keys.CONSUMER_GROUP, "-", "+", 10)}
    assert owners == {ids[0]: "one", ids[1]: "one", ids[2]: "two", ids[3]: "live",
                      ids[4]: "live"}
    consumers = {text(c["name"])
                 for c in redis_client.xinfo_consumers(stream, keys.CONSUMER_GROUP)}
    assert "dead" not in consumers and "live" in consumers
    await two.bury("dead")
    assert await live.beat(200) == []  # forgotten: nothing left to take


async def test_a_silence_of_every_batcher_names_nobody_dead_until_they_had_a_lease_to_renew(
        client: Commands) -> None:
    """When no batcher has beaten for half a lease, Redis was what stopped them (paused, cut
    off, failing over): the first beat after it opens a grace of one lease, in which a batcher
    that has not renewed yet is not named dead; one that stays silent past it is."""
    first, second = (RedisStreamQueue(client, client, partitions=1, owned=[0], consumer=c)
                     for c in ("first", "second"))
    assert await first.beat(200) == [] and await second.beat(200) == []
    await asyncio.sleep(0.3)  # nobody beats: both leases run out, as in a Redis outage
    started = time.monotonic()
    assert await first.beat(200) == []  # the grace opens: second may not have renewed yet
    named: list[str] = []
    while not named and time.monotonic() - started < 2.0:
        await asyncio.sleep(0.03)
        named = await first.beat(200)
    assert named == ["second"]
    assert time.monotonic() - started >= 0.2  # not before the grace of one lease ran out
    assert await second.beat(200) == []  # it comes back: renewed, and alive to the others
    assert await first.beat(200) == []
