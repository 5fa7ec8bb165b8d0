"""The ways Ferry's services open Redis, from one settings object: Ferry's own client.

Every Redis command of Ferry's services goes through the lean pipelined client of ``ferry.resp``
(one multiplexed connection per Redis server and process, the hot path's commands and the
occasional ones alike; a blocking read gets a connection of its own). It raises Ferry's errors
only (``ferry.errors``: ``RedisUnavailableError``, transient, or ``RedisCommandError``,
permanent), made as it parses each reply. Why this client and not redis-py or coredis:
docs/performance.md, "Which Redis client" (``make bench`` measures the three).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ferry.errors import ConfigError, RedisCommandError, RedisOutOfMemoryError
from ferry.resp.client import Commands, Locate, RedisAddress, RespClient
from ferry.resp.cluster import ClusterClient
from ferry.resp.sentinel import Sentinels
from ferry.settings import CommonSettings

log = logging.getLogger(__name__)


async def check_cluster_mode(settings: CommonSettings, redis: Commands) -> None:
    """Refuse a Redis Cluster node when ``redis_cluster`` is off: keys of other slots would be
    answered with MOVED. (With it on, the cluster client refuses a server that is not one.)"""
    if settings.redis_cluster or isinstance(redis, ClusterClient):
        return
    info = parse_info(await redis.execute("INFO", "cluster"))
    if info.get("cluster_enabled") == "1":
        raise ConfigError(f"Redis at {address(settings)} is a Redis Cluster node: set "
                          "FERRY_REDIS_CLUSTER=true (redis_cluster)")


def unavailable(exc: Exception) -> tuple[str, str]:
    """The error code and message a client gets for a dependency that cannot serve now: a Redis
    out of memory says so (nothing was written: Redis refuses a script's first write whole)."""
    if isinstance(exc, RedisOutOfMemoryError):
        return ("redis_out_of_memory", "Redis is out of memory (maxmemory reached, writes "
                "refused): nothing was queued; retry later")
    return "unavailable", f"a dependency is unavailable: {exc}"


FULL = 0.98  # used_memory / maxmemory from which Redis is as good as out of memory


async def trouble(redis: Commands, min_replicas: int = 0) -> str | None:
    """Why Redis will refuse Ferry's admissions now though it answers, or None: out of memory
    (``maxmemory`` reached under ``noeviction``), or fewer replicas than ``min_replicas``
    connected (WAIT cannot be satisfied). A Redis Cluster: its worst master."""
    for node in await _info(redis, "memory"):
        used, limit = int(node.get("used_memory", 0)), int(node.get("maxmemory", 0))
        policy = node.get("maxmemory_policy", "noeviction")
        if limit and used >= FULL * limit and policy == "noeviction":
            return (f"out of memory: {used / 2**20:.1f} MiB used of maxmemory "
                    f"{limit / 2**20:.1f} MiB (noeviction: writes are refused)")
    if min_replicas:
        for node in await _info(redis, "replication"):
            replicas = int(node.get("connected_slaves", 0))
            if node.get("role") == "master" and replicas < min_replicas:
                return (f"{replicas} replica(s) connected, fewer than redis_min_replicas="
                        f"{min_replicas}: admissions cannot be confirmed")
    return None


async def warn_of_eviction(redis: Commands) -> None:
    """Log a warning when Redis may evict keys: an evicted task record or stream is a lost
    task, so Ferry's Redis must run ``maxmemory-policy noeviction``."""
    for node in await _info(redis, "memory"):
        policy = node.get("maxmemory_policy", "noeviction")
        if policy != "noeviction" and int(node.get("maxmemory", 0)):
            log.warning("Redis evicts keys when full (maxmemory-policy %s): accepted tasks can "
                        "be lost; set maxmemory-policy noeviction (docs/redis.md)", policy)
            return


async def _info(redis: Commands, section: str) -> list[dict[str, str]]:
    """INFO ``section`` of each master: the one Redis, or every master of a Redis Cluster."""
    nodes: Sequence[Commands] = (await redis.masters() if isinstance(redis, ClusterClient)
                                 else [redis])
    return [parse_info(await node.execute("INFO", section)) for node in nodes]


def parse_info(reply: Any) -> dict[str, str]:
    """An INFO reply's ``field:value`` lines (its ``# Section`` titles left out)."""
    fields: dict[str, str] = {}
    for line in text(reply).splitlines():
        name, colon, value = line.partition(":")
        if colon and not line.startswith("#"):
            fields[name] = value.strip()
    return fields


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


def lean(settings: CommonSettings, name: str) -> Commands:
    """A lean pipelined client: one connection (per cluster node), every caller's commands in
    order."""
    if settings.redis_cluster:
        return cluster_client(settings, name)
    return RespClient(address(settings), timeout_s=settings.redis_socket_timeout_s,
                      connect_timeout_s=settings.redis_socket_timeout_s, name=name,
                      locate=locator(settings))


def locator(settings: CommonSettings) -> Locate | None:
    """With ``redis_sentinels``, what finds the master (for the lean clients); else None."""
    if not settings.redis_sentinel_nodes:
        return None
    return Sentinels(settings.redis_sentinel_nodes, settings.redis_sentinel_master,
                     address(settings), password=settings.redis_sentinel_password,
                     timeout_s=min(settings.redis_socket_timeout_s, 2.0)).master


def text(value: Any) -> str:
    """A Redis reply (bytes, as Ferry's clients return them) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def ensure_group(redis: Commands, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` (and the stream) from its start, unless it is there."""
    try:
        await redis.execute("XGROUP", "CREATE", stream, group, "0", "MKSTREAM")
    except RedisCommandError as exc:
        if exc.code != "BUSYGROUP":
            raise


def field_map(fields: Any) -> dict[bytes, bytes]:
    """A stream entry's fields (a flat list of names and values, as Redis sends them) as a
    dict; an entry deleted since it was delivered (no fields) as an empty one."""
    values = iter(fields or ())
    return dict(zip(values, values, strict=True))


def cluster_client(settings: CommonSettings, name: str) -> ClusterClient:
    """A lean client of the Redis Cluster ``redis_url`` is a node of."""
    return ClusterClient(address(settings), timeout_s=settings.redis_socket_timeout_s,
                         connect_timeout_s=settings.redis_socket_timeout_s, name=name)
