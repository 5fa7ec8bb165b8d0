"""The ways Ferry's services open Redis, from one settings object.

The hot path (admission, result reads and wake-ups, stream reads, completion) goes through the
lean pipelined client of ``ferry.resp``; everything else (consumer groups, reclaim, keep-alive,
hand-back, depth, readiness) through redis-py.
"""

from __future__ import annotations

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
        socket_connect_timeout=settings.redis_socket_timeout_s)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool and closes it in aclose()


def address(settings: CommonSettings) -> RedisAddress:
    return RedisAddress.from_url(settings.redis_url)


def lean(settings: CommonSettings, name: str) -> RespClient:
    """A lean pipelined client: one connection, every caller's commands in order."""
    return RespClient(address(settings), timeout_s=settings.redis_socket_timeout_s,
                      connect_timeout_s=settings.redis_socket_timeout_s, name=name)


def text(value: Any) -> str:
    """A Redis reply (bytes, as Ferry's clients return them) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
