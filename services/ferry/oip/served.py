"""Ferry's statistics in Redis (``ferry.oip.statistics`` says what they count): each process's
tally added into one hash per model every ``FLUSH_S``, and read back, with Triton's own answer,
for a statistics request.

A flush is one round trip of HINCRBYs (and a ZADD GT per version for its newest end), whatever
the traffic: nothing is written per task. A figure is at most ``FLUSH_S`` (and a round trip)
behind, so perf_analyzer's windows (500 ms and more) each see the work done in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ferry import keys
from ferry.errors import BackendError, RedisError, RedisUnavailableError
from ferry.oip.statistics import Counters, Drained, Served, models_in, with_ferry_figures
from ferry.resp.client import Commands
from ferry.triton.base import ModelDiscovery, ensemble_steps

log = logging.getLogger(__name__)
Metadata = Callable[[str, str], Awaitable[dict[str, Any]]]
FLUSH_S = 0.25
STOP_FLUSH_S = 2.0  # how long a stopping process tries to add its last tally
_NOT_ADDED = (TimeoutError, RedisError)  # at stop: any


class ServedStore:
    """The figures every process adds, and the sum they make."""

    def __init__(self, client: Commands) -> None:
        self.client = client

    async def add(self, drained: Drained) -> None:
        """Add one process's tally (one round trip)."""
        commands: list[tuple[Any, ...]] = []
        for model, fields in drained.fields.items():
            counts = [part for name, count in fields.items() for part in (name, count)]
            commands += [("HINCRBY", keys.served_key(model), counts[i], counts[i + 1])
                         for i in range(0, len(counts), 2)]
        for (model, version), at_ms in drained.last.items():
            commands.append(("ZADD", keys.served_last_key(model), "GT", at_ms, version))
        if commands:
            await self.client.pipeline(commands)

    async def read(self, models: Sequence[str]) -> dict[str, Counters]:
        """Each model's figures (none yet: empty)."""
        commands: list[tuple[Any, ...]] = []
        for model in models:
            commands += [("HGETALL", keys.served_key(model)),
                         ("ZRANGE", keys.served_last_key(model), 0, -1, "WITHSCORES")]
        replies = await self.client.pipeline(commands)
        return {model: Counters(_pairs(replies[2 * i], int), _pairs(replies[2 * i + 1], float))
                for i, model in enumerate(models)}


def _pairs(flat: list[bytes] | None, number: type[int] | type[float]) -> dict[str, int]:
    """A flat reply of names and numbers as a dict."""
    items = flat or []
    return {items[i].decode(): int(number(items[i + 1])) for i in range(0, len(items), 2)}


class ServedDesk:
    """One process's tally, added into Redis every ``period_s`` while it runs and once more as
    it stops (a flush Redis refuses is kept for the next)."""

    def __init__(self, client: Commands, period_s: float = FLUSH_S) -> None:
        self.store = ServedStore(client)
        self.period_s = period_s
        self.tally = Served()
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.create_task(self._every_period(), name="ferry-served")

    async def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        try:
            await asyncio.wait_for(self.flush(), STOP_FLUSH_S)
        except _NOT_ADDED as exc:
            log.warning("statistics not added at stop (%s): %d model(s) uncounted", exc,
                        len(self.tally))

    async def flush(self) -> None:
        """Add what was tallied into Redis (kept for the next flush if Redis refuses)."""
        if not len(self.tally):
            return
        drained = self.tally.drain()
        try:
            await self.store.add(drained)
        except BaseException:
            self.tally.merge(drained)
            raise

    async def _every_period(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.flush()
            except RedisUnavailableError as exc:
                log.warning("statistics not added: Redis refused (%s); trying again", exc)
            except Exception:  # a bug here must not stop the counting, nor the process
                log.exception("statistics not added; trying again")


class ServedStatistics:
    """The statistics answer: Triton's (its versions, its refusals, the model's memory) with
    Ferry's figures in place of Triton's; in the answer for every model, an ensemble's steps
    keep Triton's (``metadata``: the model metadata, through the gateway's short cache)."""

    def __init__(self, backend: ModelDiscovery, client: Commands, metadata: Metadata) -> None:
        self.backend = backend
        self.store = ServedStore(client)
        self.metadata = metadata

    async def __call__(self, model: str = "", version: str = "") -> dict[str, Any]:
        """Of the model (that version; every version without one; every model without a
        name), as Triton answers it."""
        triton = await self.backend.model_statistics(model, version)
        models = models_in(triton)
        steps = await self._ensemble_steps(models) if not model else set()
        counters = await self.store.read([m for m in models if m not in steps])
        return with_ferry_figures(triton, counters, steps)

    async def _ensemble_steps(self, models: Sequence[str]) -> set[str]:
        """The models the listed ensembles call (perf_analyzer, profiling an ensemble, asks
        every model's statistics and reads its steps' too)."""
        steps: set[str] = set()
        for model in models:
            with contextlib.suppress(BackendError):  # unloaded since it was listed
                if (await self.metadata(model, "")).get("platform") == "ensemble":
                    steps.update(ensemble_steps(await self.backend.model_config(model)))
        return steps
