"""Redis errors become Ferry's as Ferry's client parses each reply, by one rule: transient or
permanent by the error reply's first word."""

from __future__ import annotations

import hiredis
import pytest

from ferry.errors import (
    DependencyUnavailableError,
    RedisCommandError,
    RedisError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
    redis_reply_error,
)
from ferry.redis_conn import parse_info, unavailable

REPLIES: list[tuple[str, type[RedisError]]] = [
    ("LOADING Redis is loading the dataset in memory", RedisUnavailableError),
    ("READONLY You can't write against a read only replica.", RedisUnavailableError),
    ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
     RedisUnavailableError),
    ("TRYAGAIN Multiple keys request during rehashing of slot", RedisUnavailableError),
    ("CLUSTERDOWN The cluster is down", RedisUnavailableError),
    ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
     RedisUnavailableError),
    ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
     "to disk.", RedisUnavailableError),
    ("NOREPLICAS Not enough good replicas to write.", RedisUnavailableError),
    ("OOM command not allowed when used memory > 'maxmemory'.", RedisOutOfMemoryError),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", RedisCommandError),
    ("NOGROUP No such key 'ferry:{p0}:tasks' or consumer group 'ferry-batchers' in XREADGROUP "
     "with GROUP option", RedisCommandError),
    ("BUSYGROUP Consumer Group name already exists", RedisCommandError),
    ("NOSCRIPT No matching script. Please use EVAL.", RedisCommandError),
    ("ERR user_script:3: Script attempted to access nonexistent global variable 'x'",
     RedisCommandError),
    ("ERR syntax error", RedisCommandError),
    ("NOPERM User ferry has no permissions to run the 'xautoclaim' command", RedisCommandError),
    ("EXECABORT Transaction discarded because of previous errors.", RedisCommandError),
    ("MOVED 3999 127.0.0.1:6381", RedisCommandError),
]


@pytest.mark.parametrize(("reply", "kind"), REPLIES)
def test_an_error_reply_is_transient_or_permanent_by_its_first_word(
        reply: str, kind: type[RedisError]) -> None:
    error = redis_reply_error(reply)
    assert type(error) is kind and str(error) == reply
    assert error.code == reply.split(" ", 1)[0]
    assert isinstance(error, DependencyUnavailableError) is (kind is not RedisCommandError)


@pytest.mark.parametrize(("reply", "kind"), REPLIES)
def test_the_client_makes_the_error_as_it_parses_the_reply(
        reply: str, kind: type[RedisError]) -> None:
    parser = hiredis.Reader(replyError=redis_reply_error)  # as ferry.resp parses every reply
    parser.feed(b"-" + reply.encode() + b"\r\n")
    error = parser.gets()
    assert type(error) is kind and str(error) == reply


def test_an_info_reply_is_read_as_its_fields() -> None:
    reply = (b"# Memory\r\nused_memory:1024\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n"
             b"\r\n# Cluster\r\ncluster_enabled:1\r\nmodule:name=x,ver=1\r\n")
    assert parse_info(reply) == {"used_memory": "1024", "maxmemory": "0",
                                 "maxmemory_policy": "noeviction", "cluster_enabled": "1",
                                 "module": "name=x,ver=1"}


def test_out_of_memory_keeps_its_own_answer() -> None:
    oom = "OOM command not allowed when used memory > 'maxmemory'."
    assert unavailable(redis_reply_error(oom))[0] == "redis_out_of_memory"
    assert unavailable(redis_reply_error("LOADING Redis is loading")) == (
        "unavailable", "a dependency is unavailable: LOADING Redis is loading")
    assert unavailable(DependencyUnavailableError("cannot list Triton's models"))[0] == \
        "unavailable"
