"""Clients waiting for tasks to finish, woken by the completion announcements of batchers.

A task's end is announced on the channel of the process that made its id (``keys.done_channel``
of its id's tag): each announcement lists the tasks of that process that a batch finished in one
partition, with their records when small. A gateway process listens on its own channel; a wait
for another process's task (a GET that lands elsewhere, a retry at another gateway) subscribes to
that process's channel too, for as long as waits need it and ``LINGER_S`` more, and reads the
record only once Redis has confirmed the subscription.

A waiter is registered before the record is read (or, with ``Prefer: wait``, before the task is
even admitted), so a completion announced in between is not missed; a waiter woken without a
record (too large to inline, or the subscription was lost and re-established) reads Redis again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from ferry import keys
from ferry.tasks.record import Status, StoredRecord, announcements

log = logging.getLogger(__name__)
Reader = Callable[[str], Awaitable[StoredRecord | None]]
Expire = Callable[[str], Awaitable[StoredRecord | None]]  # the store's: a task's deadline passed
_RECHECK = None  # what a waiter is woken with when it must read the record itself
LINGER_S = 30.0  # how long another process's channel stays subscribed after its last wait


class Channels(Protocol):
    """Where announcements are heard (``ferry.resp.subscriber.Subscriber``)."""

    def subscribe(self, channel: str) -> asyncio.Future[None] | None: ...

    def unsubscribe(self, channel: str) -> None: ...


class Watch:
    """One client's wait for one task; woken once per announcement that concerns it."""

    def __init__(self, task_id: str, read: Reader,
                 heard: asyncio.Future[None] | None = None) -> None:
        self.task_id = task_id
        self.read = read
        self.heard = heard  # until its channel is confirmed (None: it was when it began)
        self.future: asyncio.Future[StoredRecord | None] = asyncio.get_running_loop(
            ).create_future()

    def wake(self, record: StoredRecord | None) -> None:
        if not self.future.done():
            self.future.set_result(record)

    async def final(self, timeout_s: float, known: StoredRecord | None = None,
                    *, read_first: bool = True) -> StoredRecord | None:
        """The record once final, or as it stands when ``timeout_s`` has passed.

        ``read_first=False``: the task was just admitted by this caller and is known PENDING
        (read all the same if the task's channel was not confirmed when the wait began: its end
        may have gone unheard). None: no such task (or, without a first read, not finished
        within the time).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self.heard is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await asyncio.shield(self.heard)  # other waits share it
            self.heard = None
            if not read_first:
                known = await self.read(self.task_id) or known
        record = await self.read(self.task_id) if read_first else known
        while record is None or not record.status.final:
            if read_first and record is None:
                return None  # unknown, or expired
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self._woken(remaining):
                return record
            announced = self.future.result()
            self.future = loop.create_future()
            record = announced if announced is not None else await self.read(self.task_id)
        return record

    async def _woken(self, timeout_s: float) -> bool:
        """Whether an announcement came within ``timeout_s`` (one timer, no extra task)."""
        timer = asyncio.get_running_loop().call_later(timeout_s, self.wake, _TIMED_OUT)
        try:
            return await self.future is not _TIMED_OUT
        finally:
            timer.cancel()


_TIMED_OUT = StoredRecord(Status.PENDING, b"")  # a marker: the wait's time ran out


async def final_by(watch: Watch, timeout_s: float, due: float | None, expire: Expire,
                   known: StoredRecord | None = None, *, read_first: bool = True
                   ) -> StoredRecord | None:
    """``watch.final``, held no later than ``due`` (the task's deadline, Unix seconds; None: it
    has none): a task still unfinished then ends EXPIRED (``expire``, the store's step), so that
    what the caller is answered at the deadline is what the record says for good, whatever
    comes of the task's call after it."""
    until_due = None if due is None else due - time.time()
    bounded = until_due is not None and until_due <= timeout_s  # the deadline ends the hold
    if until_due is not None:
        timeout_s = min(timeout_s, max(0.0, until_due))
    record = await watch.final(timeout_s, known, read_first=read_first)
    if not bounded or due is None or record is None or record.status.final:
        return record
    if (early := due - time.time()) > 0:  # the loop's timers may fire a hair before the clock
        await asyncio.sleep(early)
    return await expire(watch.task_id) or record


class ResultWaiters:
    """Every open wait of this process, by task id; ``channels``, where this process hears
    announcements (none: every announcement reaches it, as in tests that feed it by hand)."""

    def __init__(self, read: Reader, channels: Channels | None = None) -> None:
        self.read = read
        self.channels = channels
        self._watches: dict[bytes, list[Watch]] = {}
        self._tags: dict[str, int] = {}  # other processes' tags: their open waits here
        self._lingering: dict[str, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._watches.values())

    @contextmanager
    def watch(self, task_id: str, read: Reader | None = None) -> Iterator[Watch]:
        """Register a wait for ``task_id`` for the duration of the block (reading the record
        with ``read``, if given: an owner's read)."""
        key = task_id.encode()
        tag = keys.announce_tag(task_id)
        foreign = self.channels is not None and tag != keys.process_tag()
        watch = Watch(task_id, read or self.read, self._listen(tag) if foreign else None)
        self._watches.setdefault(key, []).append(watch)
        try:
            yield watch
        finally:
            watches = self._watches.get(key)
            if watches is not None:
                watches.remove(watch)
                if not watches:
                    del self._watches[key]
            if foreign:
                self._release(tag)

    def _listen(self, tag: str) -> asyncio.Future[None] | None:
        """One wait more on another process's channel: subscribed (and kept) while any wait
        needs it; the future while its subscription is unconfirmed."""
        assert self.channels is not None
        self._tags[tag] = self._tags.get(tag, 0) + 1
        if (lingering := self._lingering.pop(tag, None)) is not None:
            lingering.cancel()
        return self.channels.subscribe(keys.done_channel(tag))

    def _release(self, tag: str) -> None:
        left = self._tags[tag] - 1
        if left:
            self._tags[tag] = left
            return
        del self._tags[tag]
        self._lingering[tag] = asyncio.get_running_loop().call_later(
            LINGER_S, self._drop, tag)

    def _drop(self, tag: str) -> None:
        self._lingering.pop(tag, None)
        if tag not in self._tags and self.channels is not None:
            self.channels.unsubscribe(keys.done_channel(tag))

    def on_announcement(self, data: bytes) -> None:
        """Wake the waiters of every task an announcement names (others are ignored)."""
        if not self._watches:
            return
        try:
            for announced in announcements(data):
                for watch in self._watches.get(announced.task_id, ()):
                    watch.wake(announced.record)
        except ValueError:  # not from a Ferry batcher of this version: let everyone re-read
            log.warning("unreadable completion announcement (%d bytes); re-reading all waits",
                        len(data))
            self.wake_all()

    def wake_all(self) -> None:
        """Make every waiter read its record again (after the subscription was re-established)."""
        for watches in self._watches.values():
            for watch in watches:
                watch.wake(_RECHECK)


async def as_due(task_id: str, record: StoredRecord | None, expire: Expire
                 ) -> StoredRecord | None:
    """The record as read, unless the task's deadline has passed with no final record: then
    EXPIRED (``expire``), so that nobody is answered PENDING after a task's deadline."""
    if record is None or record.status.final:
        return record
    due = record.deadline_at
    if due is None or time.time() < due:
        return record
    return await expire(task_id) or record
