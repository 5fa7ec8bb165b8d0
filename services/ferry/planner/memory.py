"""Redis memory for a load: what Ferry keeps in Redis per unfinished task, per kept result and
per result-cache entry, and the ``maxmemory`` to set.

    memory = fixed + unfinished · (TASK + TASK_PER_PAYLOAD_BYTE · payload)
                   + rate · result_ttl · (RESULT + RESULT_PER_OUTPUT_BYTE · output)
                   + rate · min(cache_ttl, result_ttl) · CACHE_ENTRY

An unfinished task (queued, or read by a batcher and not finished) is its PENDING record, its
stream entry (the envelope: the payload and the task's fields) and its place in the consumer
group, and the digest key that finds it for identical requests. A finished one keeps its final
record (the output and the task's fields, in a hash) for ``result_ttl``; its stream entry is
deleted. A reusable answer's digest key is the result cache for ``cache_ttl``. jemalloc rounds
each allocation up to a size class, four per doubling: a large payload or output takes up to 25%
more than its size, so the figures per byte are 1.25: the rule meets the figures measured at
2 KB and 1 MB (within 0.1%) and is 12% above the one at 200 KB, whose size class fits snugly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ferry.errors import ConfigError

# Measured with ``.venv/bin/python -m loadtest.redis_memory`` (Redis 7.0.15, jemalloc 5.3.0,
# Ferry's default settings: 16 partitions, the result cache and collapsing on): INFO memory's
# used_memory, less the clients' buffers, per task of 2 KB, 200 KB and 1 MB payloads.
FIXED_BYTES = 1_700_000  # the server, Ferry's 64 streams with their group, the scripts
TASK_BYTES = 1_300  # an unfinished task besides its payload
TASK_PER_PAYLOAD_BYTE = 1.25
RESULT_BYTES = 1_200  # a kept result besides its output (the answer's JSON)
RESULT_PER_OUTPUT_BYTE = 1.25
CACHE_ENTRY_BYTES = 240  # a reusable answer's digest key while cached (measured 199 to 243)
# maxmemory over the estimate at the design load, for what the rule leaves out: clients' buffers
# (a batcher's read of a batch of payloads, pipelined admissions, the announcements of results),
# the replication backlog, the slow log, and jemalloc's classes between the sizes measured.
MAXMEMORY_HEADROOM = 1.25

GIB = 1 << 30
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclass(frozen=True)
class RedisSizes:
    """What each task leaves in Redis, and for how long: its payload, its answer's JSON, how
    long results are kept (``FERRY_RESULT_TTL_S``) and answers cached (``FERRY_CACHE_TTL_S``,
    0: no cache)."""

    payload_bytes: int = 2048
    output_bytes: int = 256
    result_ttl_s: float = 600.0
    cache_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        if min(self.payload_bytes, self.output_bytes, self.cache_ttl_s) < 0:
            raise ConfigError("sizes and the cache TTL must be >= 0")
        if self.result_ttl_s < 1:
            raise ConfigError("the result TTL must be at least 1 s")

    def at(self, rate_per_s: float, unfinished: int) -> RedisLoad:
        return RedisLoad(rate_per_s, unfinished, self)


@dataclass(frozen=True)
class RedisLoad:
    """What Redis holds under a load: tasks arriving at ``rate_per_s``, ``unfinished`` of them at
    once (the backlog bound), each leaving ``sizes``."""

    rate_per_s: float
    unfinished: int
    sizes: RedisSizes = RedisSizes()

    def __post_init__(self) -> None:
        if self.rate_per_s < 0 or self.unfinished < 0:
            raise ConfigError("the rate and the unfinished tasks must be >= 0")

    @property
    def kept_results(self) -> float:
        return self.rate_per_s * self.sizes.result_ttl_s

    @property
    def cache_entries(self) -> float:
        """Reusable answers' digest keys: each lives the cache TTL, at most while its result
        is kept."""
        return self.rate_per_s * min(self.sizes.cache_ttl_s, self.sizes.result_ttl_s)


@dataclass(frozen=True)
class RedisMemory:
    """Bytes of ``used_memory`` by part."""

    fixed: float
    unfinished: float
    results: float
    cache: float

    @property
    def total(self) -> float:
        return self.fixed + self.unfinished + self.results + self.cache

    def per_master(self, masters: int) -> float:
        """On a Redis Cluster: each master's share (partitions spread evenly), its own fixed
        part whole."""
        return self.fixed + (self.total - self.fixed) / max(1, masters)


def unfinished_task_bytes(payload_bytes: int) -> float:
    return TASK_BYTES + TASK_PER_PAYLOAD_BYTE * payload_bytes


def kept_result_bytes(output_bytes: int) -> float:
    return RESULT_BYTES + RESULT_PER_OUTPUT_BYTE * output_bytes


def redis_memory(load: RedisLoad) -> RedisMemory:
    """The rule of the module's docstring, by part."""
    return RedisMemory(fixed=FIXED_BYTES,
                       unfinished=load.unfinished * unfinished_task_bytes(load.sizes.payload_bytes),
                       results=load.kept_results * kept_result_bytes(load.sizes.output_bytes),
                       cache=load.cache_entries * CACHE_ENTRY_BYTES)


def maxmemory(design: RedisLoad, masters: int = 1) -> int:
    """The ``maxmemory`` to set (per master): the estimate at the design load, with headroom,
    rounded up to a whole MiB."""
    needed = MAXMEMORY_HEADROOM * redis_memory(design).per_master(masters)
    return math.ceil(needed / (1 << 20)) << 20


def byte_size(text: str) -> int:
    """``2048``, ``2K``, ``200KB``, ``1.5MiB``, ``1G``: bytes (K, M, G are powers of 1024)."""
    found = _SIZE.match(text)
    if found is None:
        raise ValueError(f"not a size: {text!r} (e.g. 2048, 2K, 200KB, 1.5M)")
    return round(float(found.group(1)) * _UNITS[found.group(2).lower()])


def human(size: float) -> str:
    """``512 B``, ``2 KiB``, ``200 KiB``, ``1.2 GiB``: three digits at most."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            value = size / scale
            shown = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:,.0f}"
            return f"{shown} {unit}"
    return f"{size:.0f} B"
