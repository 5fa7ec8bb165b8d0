"""Ferry's Redis client raises Ferry's errors against a real Redis: a refusal for good is
permanent (a plain command, a pipeline, a script, a stream read), a lost connection or a Redis out
of memory transient. And where a refusal means Redis lost its data (a missing group), the queue and
the webhook sender make it again or pass. (redis-py, a sync client, is only the test's tool.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ferry import keys
from ferry.batcher.webhooks import WebhookSender
from ferry.errors import (
    RedisCommandError,
    RedisConnectionError,
    RedisError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
)
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import lean
from ferry.resp.client import Commands
from ferry.settings import BatcherSettings, CommonSettings
from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import start_redis
from ferry.telemetry.metrics import BatcherMetrics
from tests.conftest import REDIS_CLUSTER

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

async def _refusal(call: Awaitable[Any]) -> RedisError:
    with pytest.raises(RedisError) as refused:
        await call
    return refused.value


@pytest.fixture
async def hot(redis_url: str) -> AsyncIterator[Commands]:
    """Ferry's client, as Ferry's services open it."""
    client = lean(CommonSettings(redis_url=redis_url, redis_cluster=REDIS_CLUSTER), "errors")
    yield client
    await client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[ManagedProcess, str]]:
    """A redis-server of the test's own, to fill up or to kill."""
    proc, url = start_redis(tmp_path / "redis")
    yield proc, url
    proc.stop(grace_s=1)


async def test_a_refusal_for_good_is_a_permanent_error_with_the_reply_as_redis_sent_it(
        hot: Commands) -> None:
    await hot.execute("SET", "s", "text")
    script = "return redis.call('LPUSH', KEYS[1], 'x')"
    refusals = [
        await _refusal(hot.execute("LPUSH", "s", "x")),
        await _refusal(hot.pipeline([("SET", "t", "1"), ("LPUSH", "s", "x")])),
        await _refusal(hot.execute(*hot.register_script(script).command(["s"], []))),
        await _refusal(hot.execute("XREADGROUP", "GROUP", "nobody", "c", "STREAMS", "s2", ">")),
    ]
    for refused in refusals:
        assert type(refused) is RedisCommandError
        assert refused.code in ("WRONGTYPE", "NOGROUP")
        assert str(refused).startswith(refused.code + " ")  # the reply as Redis sent it
    assert [r.code for r in refusals] == ["WRONGTYPE", "WRONGTYPE", "WRONGTYPE", "NOGROUP"]
    assert (await hot.replies([("GET", "t"), ("LPUSH", "s", "x")]))[0] == b"1"  # others ran


async def test_out_of_memory_and_a_lost_connection_are_transient(
        own_redis: tuple[ManagedProcess, str]) -> None:
    proc, url = own_redis
    hot = lean(CommonSettings(redis_url=url), "errors")
    try:
        await hot.execute("CONFIG", "SET", "maxmemory", 1)
        error = await _refusal(hot.execute("SET", "k", "v"))
        assert type(error) is RedisOutOfMemoryError and error.code == "OOM"
        proc.stop(grace_s=1)
        error = await _refusal(hot.execute("PING"))
        assert isinstance(error, RedisConnectionError)
        assert isinstance(error, RedisUnavailableError)
    finally:
        await hot.close()


async def test_a_missing_group_is_made_again_or_passed_and_a_wrong_type_raised(
        hot: Commands, redis_client: redis.Redis) -> None:
    queue = RedisStreamQueue(hot, hot, partitions=1, owned=[0], consumer="c")
    stream = keys.partition_stream(0)
    await queue.ensure_groups()
    await queue.ensure_groups()  # BUSYGROUP: made already, no error
    for lost in queue.streams:  # Redis lost its data: no group (a key at a time: a cluster's
        redis_client.delete(lost)  # streams live in the slots of their partitions)
    await queue.touch([(stream, "1-0")])  # nothing held any more: no error
    assert await queue.claim_stale(0, 10) == []
    assert await queue.read(10, 0) == []  # the read finds the group gone and makes it again
    assert redis_client.xinfo_groups(stream)
    redis_client.delete(stream)
    redis_client.set(stream, "not a stream")
    refused = await _refusal(queue.claim_stale(0, 10))  # not tried again forever: raised
    assert type(refused) is RedisCommandError and refused.code == "WRONGTYPE"


async def test_the_webhook_sender_makes_its_group_again_when_redis_loses_it(
        hot: Commands, redis_client: redis.Redis, redis_url: str) -> None:
    settings = BatcherSettings(redis_url=redis_url, redis_cluster=REDIS_CLUSTER)
    reader = None if REDIS_CLUSTER else lean(settings, "webhooks")  # (there, it polls)
    sender = WebhookSender(settings, hot, [0], "c", BatcherMetrics(), reader=reader)
    stream = keys.webhook_stream(0)
    await sender.start()
    try:
        if not REDIS_CLUSTER:  # deleted under its blocked read: UNBLOCKED
            assert await _eventually(lambda: _blocked_reading(redis_client))
        redis_client.delete(stream)
        assert await _eventually(lambda: _has_group(redis_client, stream))
        redis_client.delete(stream)  # not blocked now, or blocked again: NOGROUP or UNBLOCKED
        assert await _eventually(lambda: _has_group(redis_client, stream))
    finally:
        await sender.stop()


async def _eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _blocked_reading(client: redis.Redis) -> bool:
    return any(c.get("cmd") == "xreadgroup" for c in client.client_list())


def _has_group(client: redis.Redis, stream: str) -> bool:
    try:
        return bool(client.xinfo_groups(stream))
    except redis.ResponseError:  # no such key (yet)
        return False
