"""Both Redis clients raise Ferry's errors against a real Redis, the same for the same reply: a
refusal for good is permanent, a lost connection or a Redis out of memory transient. And where a
refusal means Redis lost its data (a missing group), the adapters make it again or pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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
from ferry.redis_conn import SlowRedis, connect, lean
from ferry.resp.client import Commands
from ferry.settings import BatcherSettings, CommonSettings
from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import start_redis
from ferry.telemetry.metrics import BatcherMetrics
from tests.conftest import REDIS_CLUSTER

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

Clients = tuple[SlowRedis, Commands]


async def _refusal(call: Awaitable[Any]) -> RedisError:
    with pytest.raises(RedisError) as refused:
        await call
    return refused.value


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[Clients]:
    """redis-py's client and the lean one, both as Ferry's services open them."""
    settings = CommonSettings(redis_url=redis_url, redis_cluster=REDIS_CLUSTER)
    slow, hot = connect(settings), lean(settings, "errors")
    yield slow, hot
    await slow.aclose()
    await hot.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[ManagedProcess, str]]:
    """A redis-server of the test's own, to fill up or to kill."""
    proc, url = start_redis(tmp_path / "redis")
    yield proc, url
    proc.stop(grace_s=1)


async def test_a_refusal_for_good_is_the_same_permanent_error_through_either_client(
        clients: Clients) -> None:
    slow, hot = clients
    await hot.execute("SET", "s", "text")
    script = "return redis.call('LPUSH', KEYS[1], 'x')"
    pipe = slow.pipeline(transaction=False)
    pipe.set("t", "1")
    pipe.lpush("s", "x")
    pairs = [
        (await _refusal(slow.lpush("s", "x")), await _refusal(hot.execute("LPUSH", "s", "x"))),
        (await _refusal(pipe.execute()), await _refusal(hot.pipeline([("LPUSH", "s", "x")]))),
        (await _refusal(slow.register_script(script)(keys=["s"])),
         await _refusal(hot.execute(*hot.register_script(script).command(["s"], [])))),
        (await _refusal(slow.xreadgroup("nobody", "c", {"s2": ">"})),
         await _refusal(hot.execute("XREADGROUP", "GROUP", "nobody", "c", "STREAMS", "s2", ">"))),
    ]
    for by_redis_py, by_lean in pairs:
        assert type(by_redis_py) is type(by_lean) is RedisCommandError
        assert by_redis_py.code == by_lean.code and by_lean.code in ("WRONGTYPE", "NOGROUP")
        assert str(by_redis_py) == str(by_lean)  # the reply as Redis sent it


async def test_out_of_memory_and_a_lost_connection_are_transient_through_either_client(
        own_redis: tuple[ManagedProcess, str]) -> None:
    proc, url = own_redis
    settings = CommonSettings(redis_url=url)
    slow, hot = connect(settings), lean(settings, "errors")
    try:
        await slow.config_set("maxmemory", 1)
        for error in (await _refusal(slow.set("k", "v")),
                      await _refusal(hot.execute("SET", "k", "v"))):
            assert type(error) is RedisOutOfMemoryError and error.code == "OOM"
        proc.stop(grace_s=1)
        for error in (await _refusal(slow.ping()), await _refusal(hot.execute("PING"))):
            assert isinstance(error, RedisConnectionError)
            assert isinstance(error, RedisUnavailableError)
    finally:
        await slow.aclose()
        await hot.close()


async def test_a_missing_group_is_made_again_or_passed_and_a_wrong_type_raised(
        clients: Clients) -> None:
    slow, hot = clients
    queue = RedisStreamQueue(slow, hot, partitions=1, owned=[0], consumer="c")
    stream = keys.partition_stream(0)
    await queue.ensure_groups()
    await queue.ensure_groups()  # BUSYGROUP: made already, no error
    await slow.delete(*queue.streams)  # Redis lost its data: no group
    await queue.touch([(stream, "1-0")])  # nothing held any more: no error
    assert await queue.claim_stale(0, 10) == []
    assert await queue.read(10, 0) == []  # the read finds the group gone and makes it again
    assert await slow.xinfo_groups(stream)
    await slow.delete(stream)
    await slow.set(stream, "not a stream")
    refused = await _refusal(queue.claim_stale(0, 10))  # not tried again forever: raised
    assert type(refused) is RedisCommandError and refused.code == "WRONGTYPE"


async def test_the_webhook_sender_makes_its_group_again_when_redis_loses_it(
        clients: Clients, redis_url: str) -> None:
    slow, _ = clients
    settings = BatcherSettings(redis_url=redis_url, redis_cluster=REDIS_CLUSTER)
    sender = WebhookSender(settings, slow, [0], "c", BatcherMetrics())
    stream = keys.webhook_stream(0)
    await sender.start()
    try:
        if not REDIS_CLUSTER:  # (there, it polls) deleted under its blocked read: UNBLOCKED
            assert await _eventually(lambda: _blocked_reading(slow))
        await slow.delete(stream)
        assert await _eventually(lambda: _has_group(slow, stream))
        await slow.delete(stream)  # not blocked now, or blocked again: NOGROUP or UNBLOCKED
        assert await _eventually(lambda: _has_group(slow, stream))
    finally:
        await sender.stop()


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _blocked_reading(slow: SlowRedis) -> bool:
    return any(c.get("cmd") == "xreadgroup" for c in await slow.client_list())


async def _has_group(slow: SlowRedis, stream: str) -> bool:
    try:
        return bool(await slow.xinfo_groups(stream))
    except RedisCommandError:  # no such key (yet)
        return False
