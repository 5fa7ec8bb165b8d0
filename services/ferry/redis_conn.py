"""The ways Ferry's services open Redis, from one settings object; redis-py's adapter.

The hot path (admission, result reads and wake-ups, stream reads, completion) goes through the
lean pipelined client of ``ferry.resp``; everything else (consumer groups, reclaim, keep-alive,
hand-back, depth, readiness) through redis-py. Both raise Ferry's errors only (``ferry.errors``:
``RedisUnavailableError``, transient, or ``RedisCommandError``, permanent): the lean client makes
them as it parses, and redis-py's clients opened here translate theirs as they leave a command,
a pipeline or a script (``translate``), by the same rule for the same reply.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as driver
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.commands.core import AsyncScript
from redis.typing import EncodableT, KeyT, ScriptTextT

from ferry.errors import (
    ConfigError,
    RedisCommandError,
    RedisConnectionError,
    RedisError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
    redis_reply_error,
)
from ferry.resp.client import Commands, Locate, RedisAddress, RespClient
from ferry.resp.cluster import ClusterClient
from ferry.resp.sentinel import Sentinels
from ferry.settings import CommonSettings

log = logging.getLogger(__name__)
SlowRedis = aioredis.Redis | RedisCluster  # redis-py, for the occasional work

# What redis-py (or a socket under it) raises: translated into Ferry's errors as it leaves.
DRIVER_ERRORS = (driver.RedisError, driver.RedisClusterException, OSError)
# The first word of the error replies redis-py has a class for, for one it raised itself
# (it keeps a reply's first word apart, as ``status_code``).
_CODES: dict[type[Exception], str] = {
    driver.BusyLoadingError: "LOADING", driver.ReadOnlyError: "READONLY",
    driver.OutOfMemoryError: "OOM", driver.TryAgainError: "TRYAGAIN",
    driver.MasterDownError: "MASTERDOWN", driver.ClusterDownError: "CLUSTERDOWN",
    driver.NoScriptError: "NOSCRIPT", driver.ExecAbortError: "EXECABORT",
    driver.NoPermissionError: "NOPERM", driver.MovedError: "MOVED", driver.AskError: "ASK",
    driver.ClusterCrossSlotError: "CROSSSLOT"}
_IN_PIPELINE = " of pipeline caused error: "  # redis-py's words before a pipeline's error reply


def translate(exc: BaseException) -> RedisError:
    """redis-py's error (or a socket's) as Ferry's: an error reply by the rule the lean client
    follows (``ferry.errors.redis_reply_error``), a failed connection as transient, the
    client's own refusal (a bad argument, a cross-slot transaction...) as permanent."""
    if isinstance(exc, driver.ResponseError | driver.BusyLoadingError):
        return redis_reply_error(_reply(exc))
    if isinstance(exc, driver.ConnectionError | driver.TimeoutError | driver.InvalidResponse
                  | OSError):
        return RedisConnectionError(str(exc) or type(exc).__name__)
    if isinstance(exc, driver.SlotNotCoveredError) or type(exc) is driver.RedisClusterException:
        return RedisUnavailableError(str(exc))  # no node reachable, or slots not all served
    return RedisCommandError(str(exc))


def _reply(exc: driver.RedisError) -> str:
    """An error reply as Redis sent it: redis-py takes its first word off when it has a class
    for it, and puts a pipeline's failed command before it (and the reply after, or the repr
    of the exception's arguments); the command, which may hold a payload, is left out."""
    message = str(exc).rpartition(_IN_PIPELINE)[2]
    if message.startswith("(") and message.endswith(",)"):
        message = _first_argument(message)
    code = getattr(exc, "status_code", None) or _CODES.get(type(exc))
    return f"{code} {message}" if code else message


def _first_argument(text: str) -> str:
    """The first of an exception's arguments written as a tuple's repr (else ``text``)."""
    with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        args = ast.literal_eval(text)
        if isinstance(args, tuple) and args and isinstance(args[0], str):
            return args[0]
    return text


class FerryRedis(aioredis.Redis):
    """redis-py's client of one Redis, whose every command, pipeline and script raises Ferry's
    errors (``translate``); its own retries and failover handling run first, on its own."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except DRIVER_ERRORS as exc:
            raise translate(exc) from exc

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        return _Pipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)

    def register_script(self, script: ScriptTextT) -> AsyncScript:  # type: ignore[override]
        return _Script(self, script)


class FerryCluster(RedisCluster):
    """redis-py's Redis Cluster client, raising Ferry's errors as ``FerryRedis`` does."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except DRIVER_ERRORS as exc:
            raise translate(exc) from exc

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None
                 ) -> ClusterPipeline:
        if shard_hint:
            raise RedisCommandError("shard_hint is not supported in cluster mode")
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]  # to mypy alone

    def register_script(self, script: ScriptTextT) -> AsyncScript:  # type: ignore[override]
        return _Script(self, script)


class _Pipeline(Pipeline):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return _translated(await super().execute(raise_on_error))
        except DRIVER_ERRORS as exc:
            raise translate(exc) from exc


class _ClusterPipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True
                      ) -> list[Any]:
        try:
            return _translated(await super().execute(raise_on_error, allow_redirections))
        except DRIVER_ERRORS as exc:
            raise translate(exc) from exc


def _translated(replies: list[Any]) -> list[Any]:
    """A pipeline's replies, the errors among them (``raise_on_error=False``) as Ferry's."""
    for index, reply in enumerate(replies):
        if isinstance(reply, DRIVER_ERRORS):
            replies[index] = translate(reply)
    return replies


class _Script(AsyncScript):
    """redis-py's script, loaded again where Redis has lost it (``NOSCRIPT``: a restart, a
    failover, ``SCRIPT FLUSH``) as redis-py's is, the error being Ferry's."""

    async def __call__(self, keys: Sequence[KeyT] | None = None,
                       args: Iterable[EncodableT] | None = None,
                       client: aioredis.Redis | RedisCluster | None = None) -> Any:
        keys, arguments = list(keys or ()), list(args or ())
        try:
            return await super().__call__(keys, arguments, client)
        except RedisCommandError as exc:
            if exc.code != "NOSCRIPT":
                raise
        self.sha = await (client or self.registered_client).script_load(self.script)
        return await super().__call__(keys, arguments, client)


def connect(settings: CommonSettings) -> SlowRedis:
    """A redis-py client over a blocking pool of ``redis_max_connections`` (bytes in, bytes out).

    Under a burst, callers queue for a connection (up to ``redis_pool_timeout_s``) instead of
    each opening one until Redis refuses. With ``redis_cluster``, redis-py's cluster client (a
    pool of that size per node).
    """
    if settings.redis_cluster:
        return FerryCluster.from_url(
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
    return FerryRedis.from_pool(pool)  # the client owns the pool and closes it in aclose()


def _through_sentinels(settings: CommonSettings) -> FerryRedis:
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


class _SentinelMaster(FerryRedis):
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
    """The error code and message a client gets for a dependency that cannot serve now: a Redis
    out of memory says so (nothing was written: Redis refuses a script's first write whole)."""
    if isinstance(exc, RedisOutOfMemoryError):
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
