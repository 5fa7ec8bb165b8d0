"""Idempotency keys: what names a key, and what makes two requests the same."""

from __future__ import annotations

import pytest

from ferry.errors import BadRequestError
from ferry.tasks.idempotency import parse_idempotency_key, redis_key, request_digest


def test_keys_are_per_client_and_hide_what_they_name() -> None:
    assert redis_key("alice", "order-1") == redis_key("alice", "order-1")
    assert redis_key("alice", "order-1") != redis_key("bob", "order-1")
    assert redis_key("a", "b\0c") != redis_key("a\0b", "c")  # no ambiguity at the seam
    assert redis_key("alice", "order-1").startswith("ferry:idem:")
    assert "order" not in redis_key("alice", "order-1")


def test_the_same_request_has_the_same_digest_and_any_change_another() -> None:
    base = request_digest("sim", 0, "text/plain", b"pay 10")
    assert base == request_digest("sim", 0, "text/plain", b"pay 10")
    for other in (request_digest("sim2", 0, "text/plain", b"pay 10"),
                  request_digest("sim", 1, "text/plain", b"pay 10"),
                  request_digest("sim", 0, "application/octet-stream", b"pay 10"),
                  request_digest("sim", 0, "text/plain", b"pay 100")):
        assert other != base


@pytest.mark.parametrize("key", ["k", "order-1", "x" * 256, "a b~!"])
def test_good_keys(key: str) -> None:
    assert parse_idempotency_key(key) == key


@pytest.mark.parametrize("key", ["", "x" * 257, "caf\u00e9", "tab\there", "nl\n"])
def test_bad_keys(key: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_idempotency_key(key)
    assert info.value.code == "invalid_idempotency_key"


def test_no_key_is_no_key() -> None:
    assert parse_idempotency_key(None) is None
