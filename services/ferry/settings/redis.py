"""The Redis settings' checks; where Redis is (``RedisAddress``, parsed from ``redis_url``), and
the sentinels' addresses parsed from ``redis_sentinels``. ``ferry.resp`` connects to these
addresses: they are the settings' values, and the settings import no feature."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from ferry.errors import ConfigError
from ferry.settings.fields import entries, refuse_duplicates

HOST = re.compile(r"[A-Za-z0-9._:-]+")  # a name, an IPv4 or an IPv6 address (its brackets gone)
CERTIFICATE_PAIRS = ("a client certificate and its key go together (redis_cert_file and "
                     "redis_key_file, triton_cert_file and triton_key_file)")


@dataclass(frozen=True)
class RedisAddress:
    """Where and how to reach Redis, from a URL as redis-py reads it: ``redis://`` or
    ``rediss://`` (TLS) with ``user:password@host:port/db``, or ``unix:///path.sock``; the
    database may also be given as ``?db=N``. Anything else in the query is refused, so the two
    clients of a service never disagree about where they are."""

    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    path: str | None = None  # a Unix socket instead of host:port
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)

    @classmethod
    def from_url(cls, url: str) -> RedisAddress:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(f"Redis URL {url!r} must start with redis://, rediss:// or "
                              "unix://")
        query = parse_qs(parts.query)
        unknown = sorted(set(query) - {"db"})
        if unknown:
            raise ConfigError(f"Redis URL {url!r}: options {unknown} are not supported; give "
                              "the database as /N or ?db=N")
        database = query["db"][-1] if "db" in query else (
            "" if parts.scheme == "unix" else parts.path.strip("/"))
        try:
            db = int(database) if database else 0
        except ValueError:
            raise ConfigError(f"Redis URL {url!r}: database {database!r} is not a number"
                              ) from None
        return cls(host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=db,
                   username=unquote(parts.username) if parts.username else None,
                   password=unquote(parts.password) if parts.password else None,
                   tls=parts.scheme == "rediss",
                   path=parts.path if parts.scheme == "unix" else None)

    def __str__(self) -> str:
        return self.path or f"{self.host}:{self.port}"


def check_redis(*, redis_url: str, redis_cluster: bool, redis_cert_file: str, redis_key_file: str,
                redis_min_replicas: int, redis_wait_ms: int) -> None:
    """A client certificate comes with its key; a Cluster has only database 0; the replicas'
    confirmation is a count and its wait a time."""
    if bool(redis_cert_file) != bool(redis_key_file):
        raise ConfigError(CERTIFICATE_PAIRS)
    if redis_cluster and (redis_url.startswith("unix:")
                          or RedisAddress.from_url(redis_url).db != 0):
        raise ConfigError("a Redis Cluster is reached over redis:// or rediss:// and has "
                          "only database 0")
    if redis_min_replicas < 0 or redis_wait_ms < 1:
        raise ConfigError("redis_min_replicas must be 0 or more and redis_wait_ms at least 1")


def redis_sentinel_nodes(*, redis_sentinels: str, redis_sentinel_master: str,
                         redis_cluster: bool) -> tuple[tuple[str, int], ...]:
    """The sentinels' (host, port), none without ``redis_sentinels``."""
    if not redis_sentinels.strip():
        return ()
    if redis_cluster:
        raise ConfigError("redis_sentinels and redis_cluster exclude each other: a "
                          "Redis Cluster fails over by itself")
    if not redis_sentinel_master:
        raise ConfigError("redis_sentinels needs redis_sentinel_master")
    return sentinels(redis_sentinels)


def sentinels(spec: str) -> tuple[tuple[str, int], ...]:
    """``host:port`` entries, comma-separated, each sentinel once."""
    entries("redis_sentinels", spec)
    nodes = tuple(sentinel_nodes(spec))
    for host, _ in nodes:
        if not HOST.fullmatch(host):
            raise ConfigError(f"redis_sentinels: {host!r} is not a host name or address")
    refuse_duplicates("redis_sentinels", (f"{h}:{p}" for h, p in nodes))
    return nodes


def sentinel_nodes(spec: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` as (host, port) pairs; a bad one is a ConfigError."""
    nodes: list[tuple[str, int]] = []
    for item in (part.strip() for part in spec.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"redis_sentinels: {item!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    return nodes
