"""Per-client request rate limits, kept in Redis so that every gateway process and replica
shares them: GCRA (the generic cell rate algorithm) in one atomic script per request.

A client may send ``burst`` requests at once and ``per_min`` a minute sustained; each request
moves the client's theoretical arrival time (TAT) on by ``60 / per_min`` seconds, and a request
is refused while the TAT is more than ``burst`` intervals ahead of Redis's clock. One key per
client, one string each, expiring when the client has its whole allowance back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from ferry import keys, lua
from ferry.errors import ConfigError, RateLimitedError
from ferry.resp.client import Commands

AUTO_BURST_MAX = 100  # the most requests at once that a rate's own burst allows


def scaled_burst(per_min: int) -> int:
    """The burst of a rate that names none: a tenth of the per-minute rate (six seconds of it),
    at least 1 and at most ``AUTO_BURST_MAX``; so a low rate limits from the first request
    (30 a minute: 3 at once, not 100)."""
    return max(1, min(AUTO_BURST_MAX, per_min // 10))


@dataclass(frozen=True)
class Rate:
    per_min: int
    burst: int

    @classmethod
    def of(cls, per_min: int, burst: int = 0) -> Rate:
        """The rate, its burst scaled from it when ``burst`` is 0."""
        return cls(per_min, burst or scaled_burst(per_min))

    @property
    def interval_ms(self) -> float:
        return 60_000.0 / self.per_min

    @property
    def policy(self) -> bytes:
        return b"%d;w=60;burst=%d" % (self.per_min, self.burst)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    remaining: int
    retry_after_s: float
    reset_s: float


class GcraKeys(NamedTuple):
    tat: str  # the client's theoretical arrival time


class GcraArgs(NamedTuple):
    interval_ms: bytes
    burst: int


class Decision(IntEnum):
    """The rate script's first value."""

    ALLOWED = 1  # then the requests remaining, and ms until the whole allowance is back
    LIMITED = 0  # then ms until one is allowed, and ms until the whole allowance is back


GCRA = lua.ScriptSpec("ferry.auth", "gcra", GcraKeys._fields, GcraArgs._fields,
                      results=(Decision, "GCRA_"))


def verdict(reply: Sequence[Any]) -> Verdict:
    """The rate script's answer."""
    decision, first, reset = Decision(int(reply[0])), reply[1], reply[2]
    if decision is Decision.ALLOWED:
        return Verdict(True, int(first), 0.0, float(reset) / 1000)
    return Verdict(False, 0, float(first) / 1000, float(reset) / 1000)


def parse_overrides(spec: str, default_burst: int = 0) -> dict[str, Rate]:
    """``client=per_min[/burst]`` entries, comma-separated (0 per minute: unlimited); an entry
    without a burst gets ``default_burst`` (0: scaled from its own rate)."""
    rates: dict[str, Rate] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        client, sep, value = part.rpartition("=")
        per_min, _, burst = value.partition("/")
        try:
            given = int(burst) if burst else None
            rate = Rate(-1, -1) if given == 0 else Rate.of(int(per_min), given or default_burst)
        except ValueError:
            rate = Rate(-1, -1)
        if not sep or not client or rate.per_min < 0 or rate.burst < 1:
            raise ConfigError(f"rate_limits: {part!r} is not 'client=per_min' or "
                              "'client=per_min/burst'")
        rates[client.strip()] = rate
    return rates


class RateLimiter:
    """Checks and counts one request of a client against its rate (refusing with 429)."""

    def __init__(self, client: Commands, default: Rate, overrides: dict[str, Rate]) -> None:
        self.client = client
        self.default = default
        self.overrides = overrides
        self._script = client.register_script(lua.source(GCRA))

    def rate(self, client_id: str) -> Rate:
        return self.overrides.get(client_id, self.default)

    async def check(self, client_id: str) -> list[tuple[bytes, bytes]]:
        """The ``RateLimit-*`` headers for an allowed request; ``RateLimitedError`` if over."""
        rate = self.rate(client_id)
        if rate.per_min == 0:
            return []
        found = verdict(await self.client.execute(*self._script.command(
            GcraKeys(tat=keys.rate_key(client_id)),
            GcraArgs(interval_ms=b"%r" % rate.interval_ms, burst=rate.burst))))
        headers = self.headers(rate, found)
        if not found.allowed:
            raise RateLimitedError(
                f"client {client_id!r} is over its rate limit of {rate.per_min} requests a "
                f"minute (bursts of {rate.burst}); retry in {found.retry_after_s:.1f} s",
                found.retry_after_s, headers)
        return headers

    @staticmethod
    def headers(rate: Rate, verdict: Verdict) -> list[tuple[bytes, bytes]]:
        return [(b"ratelimit-limit", b"%d" % rate.per_min),
                (b"ratelimit-remaining", b"%d" % verdict.remaining),
                (b"ratelimit-reset", b"%d" % math.ceil(verdict.reset_s)),
                (b"ratelimit-policy", rate.policy)]
