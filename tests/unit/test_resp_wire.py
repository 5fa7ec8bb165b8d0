"""The lean Redis client's pure parts: RESP encoding and Redis URLs."""

from __future__ import annotations

import hiredis
import pytest

from ferry.errors import ConfigError
from ferry.resp.client import RedisAddress, pack


def test_pack_is_a_resp_array_of_bulk_strings() -> None:
    assert pack(("SET", "k", b"v\r\n")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n"


def test_pack_encodes_numbers_and_unicode() -> None:
    packed = pack(("X", 42, -7, 1.5, "zürich"))
    reader = hiredis.Reader()
    reader.feed(packed)
    assert reader.gets() == [b"X", b"42", b"-7", b"1.5", "zürich".encode()]


def test_pack_of_a_large_payload() -> None:
    payload = bytes(range(256)) * 4096
    reader = hiredis.Reader()
    reader.feed(pack(("SET", "big", payload)))
    assert reader.gets() == [b"SET", b"big", payload]


def test_url_parts() -> None:
    address = RedisAddress.from_url("rediss://ferry:p%40ss@cache.internal:6380/2")
    assert (address.host, address.port, address.db, address.username, address.password,
            address.tls) == ("cache.internal", 6380, 2, "ferry", "p@ss", True)


def test_url_defaults() -> None:
    address = RedisAddress.from_url("redis://")
    assert (address.host, address.port, address.db, address.password, address.tls) == (
        "127.0.0.1", 6379, 0, None, False)


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "redis://127.0.0.1:6379/zero",
                                 "127.0.0.1:6379"])
def test_urls_that_are_not_redis_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError):
        RedisAddress.from_url(url)


def test_unix_socket_and_query_database_urls() -> None:
    address = RedisAddress.from_url("unix:///run/redis/redis.sock?db=4")
    assert (address.path, address.db, str(address)) == ("/run/redis/redis.sock", 4,
                                                        "/run/redis/redis.sock")
    assert RedisAddress.from_url("redis://cache:6380?db=2").db == 2


def test_url_options_the_lean_client_cannot_honour_are_refused() -> None:
    with pytest.raises(ConfigError, match="not supported"):
        RedisAddress.from_url("redis://cache:6380/0?ssl_cert_reqs=none")
