"""Which version answers a request: the one it pins, else its model's rollout's pick (sticky by
the request's rollout key or client id), else Triton's version policy. The rollouts are read
from Redis at most every ``REFRESH_S`` per gateway process (one read for every model), so the
split costs an admission no Redis read of its own."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ferry.errors import BadRequestError, RedisUnavailableError
from ferry.rollouts.rollout import Pick, Rollout, Sticky
from ferry.rollouts.store import RolloutStore

log = logging.getLogger(__name__)
REFRESH_S = 1.0
POLICY = Pick("", "policy")


class Versions:
    """The gateway's copy of every rollout, and the version each request goes to."""

    def __init__(self, store: RolloutStore, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.clock = clock
        self._rollouts: dict[str, Rollout] = {}
        self._read_at = -float("inf")
        self._lock = asyncio.Lock()

    async def rollout(self, model: str) -> Rollout | None:
        """The model's rollout as last read (at most ``refresh_s`` old while Redis answers)."""
        if self.clock() - self._read_at >= self.refresh_s:
            async with self._lock:
                if self.clock() - self._read_at >= self.refresh_s:
                    await self._refresh()
        return self._rollouts.get(model)

    async def _refresh(self) -> None:
        try:
            self._rollouts = await self.store.all()
        except RedisUnavailableError as exc:  # the last copy serves until Redis answers again
            log.warning("cannot read the rollouts (keeping the last copy): %s", exc)
        except BadRequestError as exc:  # a stored rollout this version cannot read
            log.error("a stored rollout is invalid (keeping the last copy): %s", exc)
        self._read_at = self.clock()

    def may_pick(self, model: str) -> bool:
        """Whether a request of ``model`` that pins no version may be given one: the model has
        a rollout, or the copy is due for a read (False: Triton's policy picks, at no cost)."""
        return model in self._rollouts or self.clock() - self._read_at >= self.refresh_s

    def cached(self, model: str) -> Rollout | None:
        """The model's rollout as last read, without reading."""
        return self._rollouts.get(model)

    def forget(self) -> None:
        """Read the rollouts again at the next request (after this gateway changed one)."""
        self._read_at = -float("inf")

    async def pick(self, model: str, asked: str, sticky: Sticky) -> tuple[Pick, Rollout | None]:
        """The version for a request of ``model`` that pins ``asked`` ('' : none), split by
        its sticky key; and the model's rollout, if it has one."""
        rollout = await self.rollout(model)
        if asked:
            return Pick(asked, "pinned"), rollout
        if rollout is None:
            return POLICY, None
        return rollout.pick(sticky.key(rollout.sticky)), rollout
