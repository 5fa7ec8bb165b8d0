"""The ways Ferry's services open Redis, from one settings object.

The hot path (admission, result reads and wake-ups, stream reads, completion) goes through the
lean pipelined client of ``ferry.resp``; everything else (consumer groups, reclaim, keep-alive,
hand-back, depth, readiness) through redis-py.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import OutOfMemoryError, RedisError

from ferry.errors import ConfigError, DependencyUnavailableError
from ferry.resp.client import Commands, Locate, RedisAddress, RespClient
from ferry.resp.cluster import ClusterClient
from ferry.resp.sentinel import Sentinels
from ferry.settings import CommonSettings

log = logging.getLogger(__name__)
SlowRedis = aioredis.Redis | RedisCluster  # redis-py, for the occasional work

# Every way a call to Redis fails for now, from either client: redis-py's errors, a broken
# socket (OSError), and the lean client's own (already DependencyUnavailableError). The one
# translation of driver errors: callers catch this, and nothing else of the drivers.
REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (RedisError, OSError, DependencyUnavailableError)


def connect(settings: CommonSettings) -> SlowRedis:
    """A redis-py client over a blocking pool of ``redis_max_connections`` (bytes in, bytes out).

    Under a burst, callers queue for a connection (up to ``redis_pool_timeout_s``) instead of
    each opening one until Redis refuses. With ``redis_cluster``, redis-py's cluster client (a
    pool of that size per node).
    """
    if settings.redis_cluster:
        return RedisCluster.from_url(
            settings.redis_url, max_connections=settings.redis_max_connections,
            socket_timeout=settings.redis_socket_timeout_s,
            socket_connect_timeout=settings.redis_socket_timeout_s, **_credentials(settings))
    if settings.redis_sentinel_nodes:
        return _through_sentinels(settings)
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s, health_check_interval=30,
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=settings.redis_socket_timeout_s, **_credentials(settings))
    return aioredis.Redis.from_pool(pool)  # the client owns the pool and closes it in aclose()


def _through_sentinels(settings: CommonSettings) -> aioredis.Redis:
    """redis-py's client of the master the sentinels name: it asks them again after a broken
    connection or a ``READONLY`` reply."""
    found = address(settings)
    extra = _credentials(settings)
    extra.update(username=found.username, password=found.password)
    if found.tls:
        extra["ssl"] = True
    sentinel_extra = {k: v for k, v in extra.items() if k.startswith("ssl")}
    if settings.redis_sentinel_password:
        sentinel_extra["password"] = settings.redis_sentinel_password
    timeouts = {"socket_timeout": settings.redis_socket_timeout_s,
                "socket_connect_timeout": settings.redis_socket_timeout_s}
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(settings.redis_sentinel_nodes), sentinel_kwargs={**sentinel_extra, **timeouts},
        **timeouts, **extra)
    master: _SentinelMaster = sentinels.master_for(
        settings.redis_sentinel_master, redis_class=_SentinelMaster, db=found.db,
        max_connections=settings.redis_max_connections)
    master.sentinel_clients = list(sentinels.sentinels)
    return master


class _SentinelMaster(aioredis.Redis):
    """redis-py's client of a master found through sentinels, which closes its connections to
    the sentinels too when it is closed."""

    sentinel_clients: list[aioredis.Redis]

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for client in getattr(self, "sentinel_clients", ()):
            await client.aclose()


async def check_cluster_mode(settings: CommonSettings, redis: SlowRedis) -> None:
    """Refuse a Redis Cluster node when ``redis_cluster`` is off: keys of other slots would be
    answered with MOVED. (With it on, both clients refuse a server that is not a cluster.)"""
    if settings.redis_cluster or isinstance(redis, RedisCluster):
        return
    info = await redis.info("cluster")
    if info.get("cluster_enabled"):
        raise ConfigError(f"Redis at {address(settings)} is a Redis Cluster node: set "
                          "FERRY_REDIS_CLUSTER=true (redis_cluster)")


def unavailable(exc: Exception) -> tuple[str, str]:
    """The error code and message a client gets for a Redis that cannot serve now: one out of
    memory says so (nothing was written: Redis refuses a script's first write whole)."""
    if str(exc).startswith("OOM") or isinstance(exc, OutOfMemoryError):
        return ("redis_out_of_memory", "Redis is out of memory (maxmemory reached, writes "
                "refused): nothing was queued; retry later")
    return "unavailable", f"a dependency is unavailable: {exc}"


FULL = 0.98  # used_memory / maxmemory from which Redis is as good as out of memory


async def trouble(redis: SlowRedis, min_replicas: int = 0) -> str | None:
    """Why Redis will refuse Ferry's admissions now though it answers, or None: out of memory
    (``maxmemory`` reached under ``noeviction``), or fewer replicas than ``min_replicas``
    connected (WAIT cannot be satisfied). A Redis Cluster: its worst master."""
    for node in _per_node(await _info(redis, "memory"), "used_memory"):
        used, limit = int(node.get("used_memory", 0)), int(node.get("maxmemory", 0))
        policy = str(node.get("maxmemory_policy", "noeviction"))
        if limit and used >= FULL * limit and policy == "noeviction":
            return (f"out of memory: {used / 2**20:.1f} MiB used of maxmemory "
                    f"{limit / 2**20:.1f} MiB (noeviction: writes are refused)")
    if min_replicas:
        for node in _per_node(await _info(redis, "replication"), "role"):
            replicas = int(node.get("connected_slaves", 0))
            if node.get("role") == "master" and replicas < min_replicas:
                return (f"{replicas} replica(s) connected, fewer than redis_min_replicas="
                        f"{min_replicas}: admissions cannot be confirmed")
    return None


async def warn_of_eviction(redis: SlowRedis) -> None:
    """Log a warning when Redis may evict keys: an evicted task record or stream is a lost
    task, so Ferry's Redis must run ``maxmemory-policy noeviction``."""
    for node in _per_node(await _info(redis, "memory"), "used_memory"):
        policy = str(node.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction" and int(node.get("maxmemory", 0)):
            log.warning("Redis evicts keys when full (maxmemory-policy %s): accepted tasks can "
                        "be lost; set maxmemory-policy noeviction (docs/redis.md)", policy)
            return


async def _info(redis: SlowRedis, section: str) -> Any:
    """INFO ``section``: of every master of a Redis Cluster (redis-py asks one node else)."""
    if isinstance(redis, RedisCluster):
        return await redis.info(section, target_nodes=RedisCluster.PRIMARIES)
    return await redis.info(section)


def _per_node(info: Any, field: str) -> list[Any]:
    """An INFO reply per node: redis-py's cluster client answers with one for each."""
    return [info] if field in info else list(info.values())


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


def cluster_client(settings: CommonSettings, name: str) -> ClusterClient:
    """A lean client of the Redis Cluster ``redis_url`` is a node of."""
    return ClusterClient(address(settings), timeout_s=settings.redis_socket_timeout_s,
                         connect_timeout_s=settings.redis_socket_timeout_s, name=name)
