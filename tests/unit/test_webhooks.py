"""Webhook allowlist and signatures: pure, no servers."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from ferry.errors import BadRequestError
from ferry.webhooks import check_callback, sign, verify

ALLOWED = frozenset({"hooks.example.com", "127.0.0.1:8080"})


@pytest.mark.parametrize("url", ["https://hooks.example.com/ferry",
                                 "http://HOOKS.example.com:9000/x?y=1",
                                 "http://127.0.0.1:8080/hook"])
def test_allowed_callbacks(url: str) -> None:
    assert check_callback(url, ALLOWED) == url


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://127.0.0.1:8081/hook", "callback_not_allowed"),  # another port
        ("http://evil.example.com/", "callback_not_allowed"),
        ("http://hooks.example.com.evil.net/", "callback_not_allowed"),
        ("http://169.254.169.254/", "callback_not_allowed"),
        ("file:///etc/passwd", "invalid_callback"),
        ("http://u:p@hooks.example.com/", "invalid_callback"),
        ("http://hooks.example.com:notaport/", "invalid_callback"),
        ("http:///nohost", "invalid_callback"),
        ("https://hooks.example.com/" + "a" * 2100, "invalid_callback"),
        ("https://hooks.example.com/\u00e9", "invalid_callback"),
    ],
)
def test_refused_callbacks(url: str, code: str) -> None:
    with pytest.raises(BadRequestError) as info:
        check_callback(url, ALLOWED)
    assert info.value.code == code


def test_no_allowlist_means_webhooks_are_off() -> None:
    with pytest.raises(BadRequestError) as info:
        check_callback("https://hooks.example.com/", frozenset())
    assert info.value.code == "webhooks_disabled"


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"task_id":"x"}'
    expected = hmac.new(b"key", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("key", 1_700_000_000, body) == f"t=1700000000,v1={expected}"


def test_verify_refuses_tampering_other_keys_and_old_timestamps() -> None:
    body = b'{"task_id":"x"}'
    header = sign("key", 1_700_000_000, body)
    assert verify("key", header, body, now=1_700_000_010)
    assert not verify("key", header, body + b" ", now=1_700_000_010)
    assert not verify("other", header, body, now=1_700_000_010)
    assert not verify("key", header, body, now=1_700_000_000 + 301)
    assert not verify("key", "garbage", body, now=1_700_000_000)
