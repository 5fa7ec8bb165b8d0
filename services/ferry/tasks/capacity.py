"""What each model can serve, as batchers measure it, shared through Redis with the gateways.

A batcher fits each model's call time t(B) and knows how many batches may run at once; from these
it reports a service rate (tasks per second at full batches) and one batch's time, every second,
in one hash (field ``<model>|<batcher>``, value ``<rate> <batch seconds> <unix time>``). A gateway
reads the hash at most once a second and, for each model, takes the highest fresh report (batchers
sharing one Triton each see all of it). The gateway sizes the backlog limit and predicts waits
from it; before any batcher has measured a model there is no rate, and a fixed limit applies.

A report also carries the model's circuit breakers, one per version (``''``: the version
Triton's policy picks, the report's own breaker field; a pinned or rolled-out version's in a
last field, ``<version>=<state>/<retry after>`` joined by commas, ``-`` for none).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ferry import keys
from ferry.resp.client import Commands

REPORT_INTERVAL_S = 1.0
STALE_AFTER_S = 15.0  # a report older than this is ignored (its batcher is gone or stuck)
KEY_TTL_S = 60


@dataclass(frozen=True)
class Capacity:
    """A model's measured service (tasks per second at full batches, one batch's time) and its
    circuit breaker as a batcher sees it."""

    rate: float = 0.0
    batch_s: float = 0.0
    breaker: str = "closed"  # closed, half_open or open
    fallback: str = ""  # the model that answers while the breaker is open ("" none)
    retry_after_s: float = 0.0  # until an open breaker lets a probe through
    # Each version's breaker the batcher has called: (version, state, retry after), by version.
    versions: tuple[tuple[str, str, float], ...] = ()

    def breaker_of(self, version: str) -> tuple[str, float]:
        """The state of the version's breaker ('': Triton's policy's) and its retry-after."""
        if not version:
            return self.breaker, self.retry_after_s
        for name, state, retry_after in self.versions:
            if name == version:
                return state, retry_after
        return "closed", 0.0


def encode(capacity: Capacity, now: float) -> str:
    versions = ",".join(f"{v}={state}/{retry:.1f}" for v, state, retry in capacity.versions)
    return (f"{capacity.rate:.3f} {capacity.batch_s:.6f} {now:.3f} {capacity.breaker} "
            f"{capacity.retry_after_s:.1f} {capacity.fallback or '-'} {versions or '-'}")


def decode(value: bytes) -> tuple[Capacity, float]:
    """A report (one written before breakers were per version lacks the last field)."""
    rate, batch_s, at, breaker, retry_after, fallback, *rest = value.decode().split(" ")
    if len(rest) > 1:
        raise ValueError("not a capacity report")
    return Capacity(float(rate), float(batch_s), breaker, "" if fallback == "-" else fallback,
                    float(retry_after), _versions(rest[0] if rest else "-")), float(at)


def _versions(field: str) -> tuple[tuple[str, str, float], ...]:
    if field == "-":
        return ()
    found = []
    for item in field.split(","):
        version, _, rest = item.partition("=")
        state, _, retry_after = rest.partition("/")
        found.append((version, state, float(retry_after)))
    return tuple(found)


def _merged_state(states: set[str]) -> str:
    """A breaker's state over the batchers that report it: open only if open in all of them
    (any other may still serve), closed if closed in any."""
    if states == {"open"}:
        return "open"
    return "closed" if "closed" in states else "half_open"


def _merged_versions(seen: list[Capacity]) -> tuple[tuple[str, str, float], ...]:
    states: dict[str, set[str]] = {}
    retry: dict[str, float] = {}
    for capacity in seen:
        for version, state, retry_after in capacity.versions:
            states.setdefault(version, set()).add(state)
            retry[version] = min(retry.get(version, retry_after), retry_after)
    return tuple((v, _merged_state(states[v]), retry[v]) for v in sorted(states))


def freshest(reports: Mapping[bytes, bytes], now: float) -> dict[str, Capacity]:
    """Per model, over reports younger than ``STALE_AFTER_S``: the highest rate, and each
    breaker open only if it is open in every batcher that reports it (any of them may still
    serve)."""
    fresh: dict[str, list[Capacity]] = {}
    for field, value in reports.items():
        model = field.decode().rsplit("|", 1)[0]
        try:
            capacity, at = decode(value)
        except ValueError:
            continue  # not written by a batcher of this version
        if now - at <= STALE_AFTER_S:
            fresh.setdefault(model, []).append(capacity)
    merged: dict[str, Capacity] = {}
    for model, seen in fresh.items():
        best = max(seen, key=lambda c: c.rate)
        merged[model] = replace(best, breaker=_merged_state({c.breaker for c in seen}),
                                retry_after_s=min(c.retry_after_s for c in seen),
                                versions=_merged_versions(seen))
    return merged


class CapacityBoard:
    """The gateway's view: refreshed from Redis at most every ``refresh_s``."""

    def __init__(self, client: Commands, *, refresh_s: float = REPORT_INTERVAL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self.clock = clock
        self._models: dict[str, Capacity] = {}
        self._read_at = -float("inf")
        self._lock = asyncio.Lock()

    async def of(self, model: str) -> Capacity:
        """The model's capacity (zeros while unmeasured). A failed refresh keeps the last view:
        admission goes on with it, and the admission script itself will tell of a Redis outage."""
        if self.clock() - self._read_at >= self.refresh_s and not self._lock.locked():
            async with self._lock:
                await self._refresh()
        return self._models.get(model, Capacity())

    async def all(self) -> dict[str, Capacity]:
        """Every reported model (refreshed like ``of``)."""
        await self.of("")
        return dict(self._models)

    async def circuits(self) -> dict[str, str]:
        """Each reported model's circuit breaker, and each of its versions' as
        ``<model>/<version>`` (with the model's fallback while not closed): ``/readyz``'s."""
        circuits: dict[str, str] = {}
        for model, c in (await self.all()).items():
            states = [(model, c.breaker)] + [(f"{model}/{v}", state) for v, state, _ in c.versions]
            for name, state in states:
                circuits[name] = state + (f", fallback {c.fallback}" if c.fallback and
                                          state != "closed" else "")
        return circuits

    async def _refresh(self) -> None:
        now = self.clock()
        self._read_at = now
        try:
            flat = await self.client.execute("HGETALL", keys.CAPACITY_KEY)
        except Exception:
            return
        pairs = iter(flat or ())
        self._models = freshest(dict(zip(pairs, pairs, strict=False)), now)


async def report(client: Commands, batcher: str, capacities: Mapping[str, Capacity],
                 now: float) -> None:
    """Publish one batcher's measurements (one round trip)."""
    if not capacities:
        return
    fields: list[str] = []
    for model, capacity in capacities.items():
        fields += [f"{model}|{batcher}", encode(capacity, now)]
    await client.pipeline([("HSET", keys.CAPACITY_KEY, *fields),
                           ("EXPIRE", keys.CAPACITY_KEY, KEY_TTL_S)])


async def withdraw(client: Commands, batcher: str, models: list[str]) -> None:
    """Remove a stopping batcher's reports."""
    if models:
        await client.execute("HDEL", keys.CAPACITY_KEY, *(f"{m}|{batcher}" for m in models))
