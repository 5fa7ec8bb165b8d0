"""The ways Ferry's services open Redis, from one settings object.

The hot path (admission, result reads and wake-ups, stream reads, completion) goes through the
lean pipelined client of ``ferry.resp``; everything else (consumer groups, reclaim, keep-alive,
hand-back, depth, readiness) through redis-py.
"""

from __future__ import annotations

import ssl
from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis

from ferry.resp.client import RedisAddress, RespClient
from ferry.settings import CommonSettings


def connect(settings: CommonSettings) -> aioredis.Redis:
    """A redis-py client over a blocking pool of ``redis_max_connections`` (bytes in, bytes out).

    Under a burst, callers queue for a connection (up to ``redis_pool_timeout_s``) instead of
    each opening one until Redis refuses.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s, health_check_interval=30,
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=settings.redis_socket_timeout_s, **_credentials(settings))
    return aioredis.Redis.from_pool(pool)  # the client owns the pool and closes it in aclose()


def _credentials(settings: CommonSettings) -> dict[str, Any]:
    """What redis-py takes besides the URL: the ACL user and password settings, and TLS files."""
    extra: dict[str, Any] = {}
    if settings.redis_username:
        extra["username"] = settings.redis_username
    if settings.redis_password:
        extra["password"] = settings.redis_password
    if settings.redis_url.startswith("rediss://"):
        if settings.redis_ca_file:
            extra["ssl_ca_certs"] = settings.redis_ca_file
        if settings.redis_cert_file:
            extra["ssl_certfile"] = settings.redis_cert_file
            extra["ssl_keyfile"] = settings.redis_key_file
    return extra


def address(settings: CommonSettings) -> RedisAddress:
    """Where the lean clients connect: the URL, with the credential and TLS settings applied."""
    found = RedisAddress.from_url(settings.redis_url)
    context = None
    if found.tls:
        context = ssl.create_default_context(cafile=settings.redis_ca_file or None)
        if settings.redis_cert_file:
            context.load_cert_chain(settings.redis_cert_file, settings.redis_key_file)
    return replace(found, username=settings.redis_username or found.username,
                   password=settings.redis_password or found.password, ssl_context=context)


def lean(settings: CommonSettings, name: str) -> RespClient:
    """A lean pipelined client: one connection, every caller's commands in order."""
    return RespClient(address(settings), timeout_s=settings.redis_socket_timeout_s,
                      connect_timeout_s=settings.redis_socket_timeout_s, name=name)


def text(value: Any) -> str:
    """A Redis reply (bytes, as Ferry's clients return them) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
