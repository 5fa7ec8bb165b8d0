"""Calls carried many at a time: while one call of a group is at Redis, the requests that
arrive wait, and the next call carries all of them, each still answered on its own.

No timer: at light load a request goes at once (the first of a group never waits), and under
load the batches form by concurrency alone, as large as what arrived during one round trip (an
"awaiting coalescer"). One call per group is out at a time; a group is what one call may carry
together (on a Redis Cluster, one slot).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - an item, as the call takes it
R = TypeVar("R")  # its reply

MAX_ITEMS = 256  # the most one call carries (the rest go in the next)
MAX_BYTES = 4 << 20  # and about the most bytes (a call carries at least one item, whatever size)


class Coalescer(Generic[I, R]):
    """``send(group, items)`` answers each item in order (a reply, or an exception for that item
    alone); an exception it raises is every item's. ``size`` tells an item's bytes."""

    def __init__(self, send: Callable[[Hashable, list[I]], Awaitable[Sequence[R | Exception]]],
                 size: Callable[[I], int] = lambda item: 0, *, max_items: int = MAX_ITEMS,
                 carried: Callable[[int], None] = lambda items: None,
                 max_bytes: int = MAX_BYTES) -> None:
        self._send = send
        self._size = size
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._waiting: dict[Hashable, list[tuple[I, asyncio.Future[R]]]] = {}
        self._out: set[Hashable] = set()
        self.calls = 0  # calls sent, and the items they carried
        self.items = 0
        self.carried = carried  # told each call's items

    async def call(self, group: Hashable, item: I) -> R:
        """``item``'s reply, sent with whatever else of ``group`` is waiting then. A caller
        cancelled while its item waits takes it out (it is never sent); once sent, only the
        reply is lost."""
        if group not in self._out:  # nothing out, so nothing waits: it goes now, alone, from
            self._out.add(group)  # the caller's own task (light load costs no task of its own)
            try:
                return await self._alone(group, item)
            finally:
                self._landed(group)
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(group, []).append((item, future))
        return await future

    def _count(self, items: int) -> None:
        """One call sent, carrying ``items``."""
        self.calls += 1
        self.items += items
        self.carried(items)

    async def _alone(self, group: Hashable, item: I) -> R:
        self._count(1)
        (reply,) = await self._send(group, [item])
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _launch(self, group: Hashable) -> None:
        """Send what waits in ``group``, up to a call's items and bytes."""
        waiting = self._waiting.pop(group)
        taken, size = 0, 0
        while taken < min(len(waiting), self.max_items) and (taken == 0 or size < self.max_bytes):
            size += self._size(waiting[taken][0])
            taken += 1
        if taken < len(waiting):
            self._waiting[group] = waiting[taken:]
        self._out.add(group)
        flight = asyncio.ensure_future(self._fly(group, waiting[:taken]))
        flight.add_done_callback(lambda _: self._landed(group))

    def _landed(self, group: Hashable) -> None:
        self._out.discard(group)
        if self._waiting.get(group):
            self._launch(group)

    async def _fly(self, group: Hashable, waiting: list[tuple[I, asyncio.Future[R]]]) -> None:
        waiting = [(item, future) for item, future in waiting if not future.done()]
        if not waiting:  # every caller gave up before the call left
            return
        try:
            self._count(len(waiting))
            replies = await self._send(group, [item for item, _ in waiting])
            for (_, future), reply in zip(waiting, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except BaseException as exc:  # every caller's, cancellation included
            for _, future in waiting:
                if future.done():
                    continue
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:
                    future.cancel()
            if not isinstance(exc, Exception):
                raise
