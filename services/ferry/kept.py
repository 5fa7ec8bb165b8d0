"""What a process asks Triton about a model with every request (its metadata, config, spec),
kept for a while and refreshed without making requests wait or ask again.

A value is kept ``ttl_s``. Past it, a request is answered from what is kept while one fetch runs
in the background; requests for a key not kept share one fetch. So a model asked for hundreds of
times a second is asked of Triton once per ``ttl_s``, not once per request that arrives while a
fetch is out: on a busy process the fetches' own CPU slowed every request, and slower fetches let
more requests in (the gateway's gRPC front spent a third of its CPU so). A refusal is not kept
(the next request asks again), and a refused refresh drops what was kept.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
LIMIT = 1024  # keys kept; past it all are dropped (any name may be asked for)


class Kept(Generic[K, V]):
    """Values by key, each fetched once per ``ttl_s`` however many ask."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 limit: int = LIMIT) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.limit = limit
        self._kept: dict[K, tuple[float, V]] = {}
        self._fetching: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K, fetch: Callable[[], Awaitable[V]], *, fresh: bool = False) -> V:
        """What ``fetch`` answers for ``key``; ``fresh``: nothing kept, a fetch that starts now."""
        found = None if fresh else self._kept.get(key)
        if found is not None:
            if self.clock() - found[0] >= self.ttl_s and key not in self._fetching:
                self._start(key, fetch).add_done_callback(retrieved)
            return found[1]
        task = self._fetching.get(key)
        if task is None or fresh:
            task = self._start(key, fetch)
        return await asyncio.shield(task)

    def peek(self, key: K) -> V | None:
        """What is kept for ``key``, however old (None: nothing)."""
        found = self._kept.get(key)
        return None if found is None else found[1]

    def drop(self, key: K) -> None:
        """Forget ``key``: the next request fetches it and waits."""
        self._kept.pop(key, None)

    def clear(self) -> None:
        self._kept.clear()

    def _start(self, key: K, fetch: Callable[[], Awaitable[V]]) -> asyncio.Task[V]:
        async def fetched() -> V:
            try:
                value = await fetch()
            except BaseException:
                self._kept.pop(key, None)
                raise
            finally:
                if self._fetching.get(key) is task:
                    del self._fetching[key]
            if len(self._kept) >= self.limit and key not in self._kept:
                self._kept.clear()
            self._kept[key] = (self.clock(), value)
            return value

        task = asyncio.get_running_loop().create_task(fetched())
        self._fetching[key] = task
        return task


def retrieved(task: asyncio.Task[Any]) -> None:
    """A background refresh's error is the next request's to see (it asks again): taken here
    so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
