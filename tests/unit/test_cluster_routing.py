"""Routing commands over a Redis Cluster: which key picks a command's slot, the slot map, and
redirections; pure functions, no server (the cluster itself is in the integration suite)."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from ferry import keys
from ferry.errors import ConfigError, RedisCommandError, RedisUnavailableError
from ferry.priority import Priority
from ferry.resp.client import Packed, Script
from ferry.resp.cluster import SLOTS, command_key, parse_slots, redirect, slot_of
from ferry.settings import CommonSettings


@pytest.mark.parametrize(("command", "key"), [
    (("HMGET", "ferry:{p3}:task:ab", "status"), b"ferry:{p3}:task:ab"),
    (("hget", b"k", "f"), b"k"),
    (("EVALSHA", "abc", 2, "ferry:{p1}:a", "ferry:{p1}:b", "arg"), b"ferry:{p1}:a"),
    (("EVAL", "return 1", 0, "arg"), None),
    (("XREADGROUP", "GROUP", "g", "c", "COUNT", 5, "BLOCK", 200, "STREAMS", "s1", "s2", ">",
      ">"), b"s1"),
    (("xreadgroup", "GROUP", "g", "c", "streams", "s1", ">"), b"s1"),
    (("XREAD", "COUNT", 1, "STREAMS"), None),  # no stream named: any node answers the error
    (("XGROUP", "CREATE", "ferry:{p2}:tasks", "g", "0", "MKSTREAM"), b"ferry:{p2}:tasks"),
    (("xgroup", "delconsumer", "s", "g", "c"), b"s"),
    (("XINFO", "GROUPS", "s"), b"s"),
    (("XINFO", "HELP"), None),
    (("PUBLISH", "ferry:done", "x"), None),
    (("CLIENT", "UNBLOCK", 7), None),
    (("PING",), None),
    (("SCRIPT", "LOAD", "return 1"), None),
    ((), None),
])
def test_the_key_that_routes_a_command(command: tuple[object, ...], key: bytes | None) -> None:
    assert command_key(command) == key  # type: ignore[arg-type]


def test_a_packed_command_carries_its_key() -> None:
    packed = Packed.of(("XREADGROUP", "GROUP", "g", "c", "STREAMS", "ferry:{p2}:tasks", ">"),
                       "ferry:{p2}:tasks")
    assert command_key(packed) == b"ferry:{p2}:tasks"
    assert command_key(Packed(b"*1\r\n$4\r\nPING\r\n")) is None


def test_scripts_name_their_first_key() -> None:
    script = Script("return 1")
    command = script.command([keys.task_key("a" * 32, 5), keys.backlog_key(5)], ["x"])
    assert slot_of(command) == key_slot(b"p5")


@pytest.mark.parametrize("partition", [0, 1, 7, 15, 255])
def test_every_key_of_a_partition_is_in_one_slot(partition: int) -> None:
    """What lets one script touch a task, its stream, backlog, dead letters and cache at once."""
    task_id = keys.new_task_id(partition, 256)
    names = [*keys.partition_streams(partition), keys.backlog_key(partition),
             keys.bell_key(partition, Priority.HIGH), keys.dead_letter_stream(partition),
             keys.task_key(task_id, partition), keys.webhook_stream(partition),
             keys.cache_key(partition, "d" * 64), keys.followers_key(partition, task_id),
             *(prefix(partition) + "anything" for prefix in (
                 keys.task_key_prefix, keys.followers_key_prefix, keys.cache_key_prefix))]
    assert {key_slot(name.encode()) for name in names} == {key_slot(f"p{partition}".encode())}


def test_sixteen_partitions_spread_over_three_masters() -> None:
    """With slots split evenly over three masters (as redis-cli --cluster create does), the
    default 16 partitions land on every master."""
    thirds = [key_slot(f"p{p}".encode()) * 3 // SLOTS for p in range(16)]
    assert set(thirds) == {0, 1, 2}


def test_the_slot_map_from_cluster_slots() -> None:
    reply = [[0, 5460, [b"10.0.0.1", 7000, b"id1"], [b"10.0.0.4", 7003, b"id4"]],
             [5461, 10922, [b"", 7001, b"id2"]],
             [10923, 16383, [b"10.0.0.3", 7002, b"id3"]]]
    table = parse_slots(reply, ("seed", 6379))
    assert table[0] == table[5460] == ("10.0.0.1", 7000)
    assert table[5461] == ("seed", 7001)  # no address announced: the node that was asked
    assert table[16383] == ("10.0.0.3", 7002)
    assert len(table) == SLOTS


def test_slots_nobody_serves_stay_unowned() -> None:
    table = parse_slots([[0, 99, [b"h", 1, b"i"]]], ("seed", 6379))
    assert table[99] == ("h", 1)
    assert table[100] is None


@pytest.mark.parametrize(("reply", "expected"), [
    (RedisCommandError("MOVED 3999 127.0.0.1:6381"), ("MOVED", ("127.0.0.1", 6381))),
    (RedisCommandError("ASK 3999 10.1.2.3:7000"), ("ASK", ("10.1.2.3", 7000))),
    (RedisCommandError("ERR wrong number of arguments"), None),
    (RedisUnavailableError("TRYAGAIN Multiple keys request during rehashing of slot"), None),
    (b"MOVED 1 a:1", None),  # a value, not an error reply
])
def test_redirections(reply: object, expected: tuple[str, tuple[str, int]] | None) -> None:
    assert redirect(reply) == expected


def test_cluster_settings_refuse_what_a_cluster_cannot_be() -> None:
    with pytest.raises(ConfigError, match="only database 0"):
        CommonSettings(redis_url="redis://127.0.0.1:7000/2", redis_cluster=True)
    with pytest.raises(ConfigError, match="only database 0"):
        CommonSettings(redis_url="unix:///run/redis.sock", redis_cluster=True)
    CommonSettings(redis_url="rediss://user:secret@redis.example:7000/0", redis_cluster=True)
