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
from ferry.errors import RateLimitedError
from ferry.resp.client import Commands
from ferry.settings.auth import AUTO_BURST_MAX, Rate, parse_overrides, scaled_burst

# A rate, and how the settings parse the per-client ones, are the settings': named here too.
__all__ = ["AUTO_BURST_MAX", "GCRA", "Decision", "GcraArgs", "GcraKeys", "Rate", "RateLimiter",
           "Verdict", "parse_overrides", "scaled_burst", "verdict"]


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
