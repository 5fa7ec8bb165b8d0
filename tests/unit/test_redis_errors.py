"""Redis errors become Ferry's at the two clients' adapters, by one rule: transient or permanent
by the error reply's first word, the same for the same reply whichever client carried it."""

from __future__ import annotations

import hiredis
import pytest
from redis import exceptions as driver
from redis._parsers.base import BaseParser  # how redis-py makes an error reply's exception

from ferry.errors import (
    DependencyUnavailableError,
    RedisCommandError,
    RedisConnectionError,
    RedisError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
    redis_reply_error,
)
from ferry.redis_conn import translate, unavailable

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


def redis_py_error(reply: str) -> driver.RedisError:
    """The exception redis-py raises for ``reply``."""
    error: driver.RedisError = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
    return error


@pytest.mark.parametrize(("reply", "kind"), REPLIES)
def test_an_error_reply_is_transient_or_permanent_by_its_first_word(
        reply: str, kind: type[RedisError]) -> None:
    error = redis_reply_error(reply)
    assert type(error) is kind and str(error) == reply
    assert error.code == reply.split(" ", 1)[0]
    assert isinstance(error, DependencyUnavailableError) is (kind is not RedisCommandError)


@pytest.mark.parametrize(("reply", "kind"), REPLIES)
def test_both_clients_make_the_same_error_of_the_same_reply(
        reply: str, kind: type[RedisError]) -> None:
    lean = hiredis.Reader(replyError=redis_reply_error)  # as ferry.resp parses every reply
    lean.feed(b"-" + reply.encode() + b"\r\n")
    by_lean, by_redis_py = lean.gets(), translate(redis_py_error(reply))
    assert type(by_lean) is type(by_redis_py) is kind
    assert str(by_lean) == str(by_redis_py) == reply


@pytest.mark.parametrize("style", ["repr", "plain"])
def test_a_pipelines_error_is_read_past_the_words_redis_py_puts_before_it(style: str) -> None:
    for reply, kind in [("BUSY Redis is busy running a script.", RedisUnavailableError),
                        ("OOM command not allowed when used memory > 'maxmemory'.",
                         RedisOutOfMemoryError),
                        ("WRONGTYPE Operation against a key holding the wrong kind of value",
                         RedisCommandError)]:
        error = redis_py_error(reply)
        said = repr(error.args) if style == "repr" else error.args[0]  # Redis, RedisCluster
        error.args = (f"Command # 2 (XADD ferry:{{p3}}:tasks * task b'(...)',) of pipeline "
                      f"caused error: {said}",)
        translated = translate(error)
        assert type(translated) is kind and str(translated) == reply  # no payload in it


@pytest.mark.parametrize(("error", "kind"), [
    (driver.ConnectionError("Error 111 connecting to 127.0.0.1:6399. Connection refused."),
     RedisConnectionError),
    (driver.TimeoutError("Timeout reading from socket"), RedisConnectionError),
    (driver.AuthenticationError("invalid username-password pair"), RedisConnectionError),
    (driver.MaxConnectionsError("Too many connections"), RedisConnectionError),
    (ConnectionResetError(104, "Connection reset by peer"), RedisConnectionError),
    (TimeoutError(), RedisConnectionError),
    (driver.SlotNotCoveredError('Slot "7" is not covered by the cluster.'),
     RedisUnavailableError),
    (driver.RedisClusterException("Redis Cluster cannot be connected."), RedisUnavailableError),
    (driver.DataError("Invalid input of type: 'dict'."), RedisCommandError),
    (driver.CrossSlotTransactionError("keys in request don't hash to the same slot"),
     RedisCommandError),
])
def test_a_failed_connection_is_transient_and_a_clients_own_refusal_permanent(
        error: Exception, kind: type[RedisError]) -> None:
    translated = translate(error)
    assert type(translated) is kind and str(translated)


def test_out_of_memory_keeps_its_own_answer() -> None:
    oom = "OOM command not allowed when used memory > 'maxmemory'."
    assert unavailable(translate(redis_py_error(oom)))[0] == "redis_out_of_memory"
    assert unavailable(redis_reply_error(oom))[0] == "redis_out_of_memory"
    assert unavailable(redis_reply_error("LOADING Redis is loading")) == (
        "unavailable", "a dependency is unavailable: LOADING Redis is loading")
    assert unavailable(DependencyUnavailableError("cannot list Triton's models"))[0] == \
        "unavailable"
