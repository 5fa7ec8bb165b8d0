"""The Redis settings' checks, and the sentinels' addresses parsed from ``redis_sentinels``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ferry.errors import ConfigError
from ferry.resp.client import RedisAddress
from ferry.resp.sentinel import sentinel_nodes
from ferry.settings.fields import entries, refuse_duplicates

if TYPE_CHECKING:
    from ferry.settings.services import CommonSettings

HOST = re.compile(r"[A-Za-z0-9._:-]+")  # a name, an IPv4 or an IPv6 address (its brackets gone)
CERTIFICATE_PAIRS = ("a client certificate and its key go together (redis_cert_file and "
                     "redis_key_file, triton_cert_file and triton_key_file)")


def redis_sentinel_nodes(settings: CommonSettings) -> tuple[tuple[str, int], ...]:
    """Check the Redis settings; the sentinels' (host, port), none without ``redis_sentinels``."""
    if bool(settings.redis_cert_file) != bool(settings.redis_key_file):
        raise ConfigError(CERTIFICATE_PAIRS)
    if settings.redis_cluster and (settings.redis_url.startswith("unix:")
                                   or RedisAddress.from_url(settings.redis_url).db != 0):
        raise ConfigError("a Redis Cluster is reached over redis:// or rediss:// and has "
                          "only database 0")
    if settings.redis_min_replicas < 0 or settings.redis_wait_ms < 1:
        raise ConfigError("redis_min_replicas must be 0 or more and redis_wait_ms at least 1")
    if not settings.redis_sentinels.strip():
        return ()
    if settings.redis_cluster:
        raise ConfigError("redis_sentinels and redis_cluster exclude each other: a "
                          "Redis Cluster fails over by itself")
    if not settings.redis_sentinel_master:
        raise ConfigError("redis_sentinels needs redis_sentinel_master")
    return sentinels(settings.redis_sentinels)


def sentinels(spec: str) -> tuple[tuple[str, int], ...]:
    """``host:port`` entries, comma-separated, each sentinel once."""
    entries("redis_sentinels", spec)
    nodes = tuple(sentinel_nodes(spec))
    for host, _ in nodes:
        if not HOST.fullmatch(host):
            raise ConfigError(f"redis_sentinels: {host!r} is not a host name or address")
    refuse_duplicates("redis_sentinels", (f"{h}:{p}" for h, p in nodes))
    return nodes
