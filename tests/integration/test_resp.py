"""The lean pipelined Redis client and the subscriber, against real redis-servers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ferry.errors import RedisCommandError
from ferry.resp.client import (
    RedisAddress,
    RespClient,
    RespConnectionError,
    RespTimeoutError,
)
from ferry.resp.subscriber import Subscriber
from ferry.stack.ports import free_port
from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import start_redis
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration


def client(url: str, **options: float) -> RespClient:
    return RespClient(RedisAddress.from_url(url), **options)  # type: ignore[arg-type]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[ManagedProcess, int, Path]]:
    """A redis-server of this test's own, to restart or stop."""
    port = free_port()
    proc, _ = start_redis(tmp_path / "redis", port=port)
    yield proc, port, tmp_path / "redis"
    proc.stop(grace_s=5)


async def test_commands_and_pipelines(redis_url: str) -> None:
    c = client(redis_url)
    try:
        assert await c.execute("SET", "k", b"\x00\xffbytes") == b"OK"
        assert await c.execute("GET", "k") == b"\x00\xffbytes"
        assert await c.pipeline([("INCR", "n"), ("INCRBY", "n", 41), ("GET", "n"),
                                 ("HSET", "h", "f", 1.5), ("HGET", "h", "f")]) == [
            1, 42, b"42", 1, b"1.5"]
        assert await c.pipeline([]) == []
    finally:
        await c.close()


async def test_many_callers_share_one_connection_and_each_gets_its_own_reply(
    redis_url: str, redis_client: redis.Redis,
) -> None:
    c = client(redis_url)
    try:
        replies = await asyncio.gather(*(c.execute("ECHO", f"caller-{i}") for i in range(2000)))
        assert replies == [f"caller-{i}".encode() for i in range(2000)]
        clients = [x for x in redis_client.client_list() if x.get("name") == "ferry"]
        assert len(clients) == 1
    finally:
        await c.close()


async def test_an_error_reply_raises_and_the_connection_carries_on(redis_url: str) -> None:
    c = client(redis_url)
    try:
        await c.execute("SET", "s", "text")
        with pytest.raises(RedisCommandError, match="WRONGTYPE"):
            await c.execute("LPUSH", "s", "x")
        with pytest.raises(RedisCommandError, match="ERR value is not an integer"):
            await c.pipeline([("SET", "a", "1"), ("INCR", "s"), ("SET", "b", "2")])
        assert await c.execute("MGET", "a", "b") == [b"1", b"2"]  # the whole pipeline ran
    finally:
        await c.close()


async def test_scripts_survive_a_flushed_script_cache_without_running_twice(
    redis_url: str, redis_client: redis.Redis,
) -> None:
    c = client(redis_url)
    script = c.register_script("return redis.call('INCR', KEYS[1])")
    try:
        assert await c.execute(*script.command(["counter"], [])) == 1
        redis_client.script_flush()
        replies = await c.pipeline([script.command(["counter"], []), ("INCR", "other"),
                                    script.command(["counter"], [])])
        assert replies == [2, 1, 3]
        assert redis_client.get("counter") == b"3" and redis_client.get("other") == b"1"
    finally:
        await c.close()


async def test_a_timeout_drops_the_connection_and_the_next_call_reconnects(
    redis_url: str,
) -> None:
    c = client(redis_url, timeout_s=0.2)
    try:
        with pytest.raises(RespTimeoutError):
            await c.execute("BLPOP", "never", 5)
        assert await c.execute("PING") == b"PONG"
    finally:
        await c.close()


async def test_a_blocking_command_may_have_a_longer_timeout(redis_url: str) -> None:
    c = client(redis_url, timeout_s=0.2)
    try:
        assert await c.execute("BLPOP", "never", 0.5, timeout_s=2.0) is None
    finally:
        await c.close()


async def test_a_restarted_redis_is_reconnected_to(
    private_redis: tuple[ManagedProcess, int, Path],
) -> None:
    proc, port, data = private_redis
    c = client(f"redis://127.0.0.1:{port}/0", timeout_s=2.0)
    try:
        assert await c.execute("PING") == b"PONG"
        proc.stop(grace_s=5)
        with pytest.raises(RespConnectionError):
            await c.execute("PING")
        proc, _ = start_redis(data, port=port)
        assert await c.execute("PING") == b"PONG"
    finally:
        await c.close()
        proc.stop(grace_s=5)


async def test_a_frozen_redis_times_out_instead_of_hanging(
    private_redis: tuple[ManagedProcess, int, Path],
) -> None:
    proc, port, _ = private_redis
    c = client(f"redis://127.0.0.1:{port}/0", timeout_s=0.3)
    pid = proc.pid
    assert pid is not None
    try:
        assert await c.execute("PING") == b"PONG"
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(RespTimeoutError):
            await c.execute("PING")
    finally:
        os.kill(pid, signal.SIGCONT)
        await c.close()


async def test_callers_of_a_client_closed_while_it_connects_get_a_connection_error(
    private_redis: tuple[ManagedProcess, int, Path],
) -> None:
    """A Redis Cluster client closes a node's client when the node leaves the slot map, maybe
    while callers wait for its connection: they get a connection error (the request answers
    503, to retry), never a cancellation, which would end the request itself (a CI run saw
    one through a master's failover). A frozen redis-server keeps the attempt open."""
    proc, port, _ = private_redis
    pid = proc.pid
    assert pid is not None
    c = client(f"redis://127.0.0.1:{port}/0", timeout_s=5.0, connect_timeout_s=5.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        callers = [asyncio.ensure_future(c.execute("PING")) for _ in range(5)]
        # They all wait on the one attempt: connected (the kernel accepts for the frozen
        # server), its handshake unanswered.
        assert await wait_until(lambda: connections_to(port) == 1, 5)
        assert not any(caller.done() for caller in callers)
        await c.close()
        results = await asyncio.gather(*callers, return_exceptions=True)
        assert all(isinstance(r, RespConnectionError) for r in results), results
        assert "closed while it was being opened" in str(results[0])
    finally:
        os.kill(pid, signal.SIGCONT)
        await c.close()


def connections_to(port: int) -> int:
    """Established TCP connections to 127.0.0.1:``port`` on this machine (the clients' ends:
    their remote address is the port)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    wanted = f"0100007F:{port:04X}"
    return sum(1 for row in rows if row.split()[2] == wanted and row.split()[3] == "01")


async def test_password_and_database_from_the_url(tmp_path: Path) -> None:
    port = free_port()
    proc = ManagedProcess("redis-server", ["redis-server", "--port", str(port), "--bind",
                                           "127.0.0.1", "--save", "", "--requirepass", "s3cr:t"])
    proc.start()
    try:
        assert await wait_until(lambda: _answers(port, "s3cr:t"), 10)
        c = client(f"redis://:s3cr%3At@127.0.0.1:{port}/3")
        await c.execute("SET", "where", "db3")
        await c.close()
        check = redis.Redis(port=port, password="s3cr:t", db=3)
        assert check.get("where") == b"db3"
        check.close()
        wrong = client(f"redis://:nope@127.0.0.1:{port}/0")
        with pytest.raises(RespConnectionError, match=r"WRONGPASS"):  # Redis unusable as set
            await wrong.execute("PING")
        await wrong.close()
    finally:
        proc.stop(grace_s=5)


def _answers(port: int, password: str) -> bool:
    try:
        return bool(redis.Redis(port=port, password=password).ping())
    except redis.RedisError:
        return False


async def test_subscriber_hears_messages_and_resubscribes_after_a_restart(
    private_redis: tuple[ManagedProcess, int, Path],
) -> None:
    proc, port, data = private_redis
    heard: list[bytes] = []
    connects: list[int] = []
    sub = Subscriber(RedisAddress.from_url(f"redis://127.0.0.1:{port}/0"), "news",
                     heard.append, lambda: connects.append(1), timeout_s=2.0,
                     ping_interval_s=0.5)
    publisher = redis.Redis(port=port)
    await sub.start()
    try:
        assert await wait_until(sub.connected.is_set, 5)
        publisher.publish("news", b"one")
        assert await wait_until(lambda: heard == [b"one"], 5)
        confirming = sub.subscribe("more")  # a channel added while it runs: once confirmed,
        assert confirming is not None  # it is heard
        await asyncio.wait_for(confirming, 5)
        assert sub.subscribe("more") is None  # confirmed already
        sub.subscribe("gone")
        sub.unsubscribe("gone")
        publisher.publish("more", b"extra")
        assert await wait_until(lambda: heard == [b"one", b"extra"], 5)
        proc.stop(grace_s=5)
        proc, _ = start_redis(data, port=port)
        assert await wait_until(lambda: len(connects) >= 2 and sub.connected.is_set(), 10)
        again = redis.Redis(port=port)
        again.publish("news", b"two")
        again.publish("gone", b"not heard")
        again.publish("more", b"three")  # resubscribed too
        assert await wait_until(lambda: heard == [b"one", b"extra", b"two", b"three"], 5)
        assert again.pubsub_numsub("news", "more", "gone") == [
            (b"news", 1), (b"more", 1), (b"gone", 0)]
    finally:
        await sub.stop()
        proc.stop(grace_s=5)


async def test_a_subscriber_stops_at_once_at_any_point_of_its_life(redis_url: str) -> None:
    """Stopped while connecting, while subscribing, or while listening: it ends promptly (a
    stop that raced with subscribing once left a gateway's shutdown waiting for ever)."""
    for delay in (0.0, 0.0005, 0.002, 0.01, 0.05):
        for _ in range(5):
            sub = Subscriber(RedisAddress.from_url(redis_url), "news", lambda _: None,
                             lambda: None, ping_interval_s=0.2)
            await sub.start()
            await asyncio.sleep(delay)  # a point of its life: time itself passes
            async with asyncio.timeout(2.0):
                await sub.stop()
            assert not sub.connected.is_set()


async def test_callers_share_one_connection_attempt_to_a_redis_that_does_not_answer() -> None:
    """Fifty callers against a server that accepts but never answers all fail in about one
    timeout, not fifty of them one after the other."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(1 << 16):  # never answers; ends when the client hangs up
                pass
        finally:
            writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = client(f"redis://127.0.0.1:{port}/0", timeout_s=0.3, connect_timeout_s=0.3)
    try:
        started = asyncio.get_running_loop().time()
        results = await asyncio.gather(*(c.execute("PING") for _ in range(50)),
                                       return_exceptions=True)
        took = asyncio.get_running_loop().time() - started
        assert all(isinstance(r, RespConnectionError) for r in results), results[:3]
        assert took < 2.0
        with pytest.raises(RespConnectionError, match="unreachable"):  # held down, at once
            await c.execute("PING")
    finally:
        await c.close()
        server.close()
        await server.wait_closed()


async def test_a_unix_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "redis.sock"
    proc = ManagedProcess("redis-server", ["redis-server", "--port", "0", "--unixsocket",
                                           str(socket_path), "--save", ""])
    proc.start()
    try:
        assert await wait_until(socket_path.exists, 10)
        c = client(f"unix://{socket_path}?db=1")
        assert await c.execute("SET", "via", "socket") == b"OK"
        await c.close()
        check = redis.Redis(unix_socket_path=str(socket_path), db=1)
        assert check.get("via") == b"socket"
        check.close()
    finally:
        proc.stop(grace_s=5)


async def test_a_sharded_subscriber_moves_to_where_its_slot_is_served_now(
    tmp_path: Path,
) -> None:
    """After a manual failover Redis ends no sharded subscription: the subscriber looks at
    every ping where its slot is served, and subscribes again there when that changed."""
    (one, one_url), (two, two_url) = start_redis(tmp_path / "one"), start_redis(tmp_path / "two")
    serving = [RedisAddress.from_url(one_url)]

    async def where() -> RedisAddress:
        return serving[0]

    heard: list[bytes] = []
    connects: list[int] = []
    sub = Subscriber(serving[0], "done{p3}", heard.append, lambda: connects.append(1),
                     timeout_s=2.0, ping_interval_s=0.2, locate=where, sharded=True,
                     where=where)
    try:
        await sub.start()
        assert await wait_until(sub.connected.is_set, 5)
        redis.Redis.from_url(one_url).spublish("done{p3}", b"one")
        assert await wait_until(lambda: heard == [b"one"], 5)
        serving[0] = RedisAddress.from_url(two_url)
        assert await wait_until(lambda: len(connects) == 2 and sub.connected.is_set(), 5)
        assert redis.Redis.from_url(two_url).spublish("done{p3}", b"two") == 1
        assert await wait_until(lambda: heard == [b"one", b"two"], 5)
    finally:
        await sub.stop()
        one.stop(grace_s=5)
        two.stop(grace_s=5)


async def test_its_own_sharded_unsubscribe_is_not_taken_for_a_moved_slot(redis_url: str) -> None:
    """Redis confirms an SUNSUBSCRIBE as it ends a subscription whose slot moved; a channel
    dropped and at once wanted again (a wait's linger ending as another wait begins) must not
    cost the connection."""
    heard: list[bytes] = []
    connects: list[int] = []
    sub = Subscriber(RedisAddress.from_url(redis_url), "done{p3}", heard.append,
                     lambda: connects.append(1), sharded=True)
    await sub.start()
    try:
        assert await wait_until(sub.connected.is_set, 5)
        confirming = sub.subscribe("other{p3}")
        assert confirming is not None
        await asyncio.wait_for(confirming, 5)
        sub.unsubscribe("other{p3}")
        again = sub.subscribe("other{p3}")  # before Redis confirmed the SUNSUBSCRIBE
        assert again is not None
        await asyncio.wait_for(again, 5)
        # replies come in order: once a later subscription is confirmed, so is the SUNSUBSCRIBE
        later = sub.subscribe("later{p3}")
        assert later is not None
        await asyncio.wait_for(later, 5)
        publisher = redis.Redis.from_url(redis_url)
        assert publisher.spublish("other{p3}", b"still") == 1
        assert await wait_until(lambda: heard == [b"still"], 5)
        assert connects == [1]
    finally:
        await sub.stop()


async def test_a_redis_without_sharded_pubsub_is_logged_and_not_asked_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis before 7.0 has no SSUBSCRIBE (here: a Redis with it renamed away): one error in
    the log, and no reconnecting for ever."""
    proc, url = start_redis(tmp_path / "old", extra=("--rename-command", "SSUBSCRIBE", ""))
    sub = Subscriber(RedisAddress.from_url(url), "done{p3}", lambda _: None, lambda: None,
                     timeout_s=2.0, sharded=True)
    try:
        with caplog.at_level("INFO", logger="ferry.resp.subscriber"):
            await sub.start()
            assert await wait_until(lambda: "refused for good" in caplog.text, 5)
            # its loop has ended: nothing is left to ask again (not "no retry seen yet")
            assert await wait_until(lambda: not sub.running, 5)
        assert caplog.text.count("refused for good") == 1
        assert "resubscribing" not in caplog.text
        assert not sub.connected.is_set()
    finally:
        await sub.stop()
        proc.stop(grace_s=5)
