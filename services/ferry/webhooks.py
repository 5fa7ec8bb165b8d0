"""Webhooks: who may be called back, how a call is signed, and how a receiver checks it.

A client names ``callback_url`` (JSON) or ``Ferry-Callback`` (header); only hosts on
``FERRY_WEBHOOK_ALLOWED_HOSTS`` are accepted (none by default: webhooks are off), so Ferry cannot be
made to call arbitrary internal addresses, and redirects are never followed. When the task ends,
its final record is POSTed there with ``Ferry-Signature: t=<unix seconds>,v1=<hex>``, the
HMAC-SHA256 of ``"<t>." + body`` under ``FERRY_WEBHOOK_SECRET``: a receiver recomputes it and
refuses a timestamp older than ``REPLAY_WINDOW_S`` (a replayed call).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ferry.errors import BadRequestError

MAX_URL_LENGTH = 2048
REPLAY_WINDOW_S = 300
SIGNATURE_HEADER = "Ferry-Signature"


def check_callback(url: str, allowed: frozenset[str]) -> str:
    """The URL if Ferry may call it, else a 400 that says why."""
    if not allowed:
        raise BadRequestError("webhooks_disabled", "webhooks are off on this Ferry "
                              "(FERRY_WEBHOOK_ALLOWED_HOSTS is empty)")
    if len(url) > MAX_URL_LENGTH or not url.isascii() or not url.isprintable():
        raise BadRequestError("invalid_callback", f"the callback URL must be at most "
                              f"{MAX_URL_LENGTH} printable ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadRequestError("invalid_callback", f"the callback URL is malformed: {exc}") from None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host or parts.username or parts.password:
        raise BadRequestError("invalid_callback", "the callback URL must be http(s)://host/... "
                              "without credentials")
    if host not in allowed and f"{host}:{port}" not in allowed:
        raise BadRequestError("callback_not_allowed", f"{host!r} is not on this Ferry's "
                              "webhook allowlist")
    return url


class CallbackRefusedError(Exception):
    """The callback's name resolves to an address Ferry does not call."""


@dataclass(frozen=True)
class Target:
    """Where a webhook is POSTed: the URL with its host replaced by the address that was
    checked (so that a name cannot resolve to another one between check and call), and what
    keeps the name: the ``Host`` header and, for https, the TLS server name."""

    url: str
    headers: dict[str, str]
    extensions: dict[str, Any]


def allowed_address(address: str, allow_private: bool) -> bool:
    """A public (global) address, or any when private ones are allowed."""
    return allow_private or ipaddress.ip_address(address.split("%", 1)[0]).is_global


async def pin(url: str, allow_private: bool) -> Target:
    """Resolve the callback's host once and check every address it has. An allowlisted IP
    literal is taken as the operator wrote it; a name must resolve to public addresses only,
    unless private ones are allowed (``FERRY_WEBHOOK_ALLOW_PRIVATE``): an allowlisted name
    cannot be pointed at 169.254.169.254, loopback or the cluster's own network."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return Target(url, {}, {})
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CallbackRefusedError(f"cannot resolve {host!r}: {exc.strerror or exc}") from None
    addresses = [str(info[4][0]) for info in infos]
    refused = [a for a in addresses if not allowed_address(a, allow_private)]
    if not addresses or refused:
        raise CallbackRefusedError(f"{host!r} resolves to a non-public address; set "
                                   "FERRY_WEBHOOK_ALLOW_PRIVATE=true to call private networks")
    address = addresses[0]
    netloc = f"[{address}]" if ":" in address else address
    pinned = parts._replace(netloc=f"{netloc}:{port}").geturl()
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return Target(pinned, {"Host": parts.netloc.rpartition("@")[2]}, extensions)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Ferry-Signature`` value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), b"%d." % timestamp + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, now: float) -> bool:
    """What a receiver does: the signature matches and is recent."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > REPLAY_WINDOW_S:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), header)
