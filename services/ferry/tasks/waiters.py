"""Clients waiting for tasks to finish, woken by the completion announcements of batchers.

A gateway process keeps one subscription to ``DONE_CHANNEL``; each announcement lists the tasks a
batch finished in one partition, with their records when small. A waiter is registered before the
record is read (or, with ``Prefer: wait``, before the task is even admitted), so a completion
announced in between is not missed; a waiter woken without a record (too large to inline, or the
subscription was lost and re-established) reads Redis again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from ferry.tasks.record import Status, StoredRecord, announcements

log = logging.getLogger(__name__)
Reader = Callable[[str], Awaitable[StoredRecord | None]]
_RECHECK = None  # what a waiter is woken with when it must read the record itself


class Watch:
    """One client's wait for one task; woken once per announcement that concerns it."""

    def __init__(self, task_id: str, read: Reader) -> None:
        self.task_id = task_id
        self.read = read
        self.future: asyncio.Future[StoredRecord | None] = asyncio.get_running_loop(
            ).create_future()

    def wake(self, record: StoredRecord | None) -> None:
        if not self.future.done():
            self.future.set_result(record)

    async def final(self, timeout_s: float, known: StoredRecord | None = None,
                    *, read_first: bool = True) -> StoredRecord | None:
        """The record once final, or as it stands when ``timeout_s`` has passed.

        ``read_first=False``: the task was just admitted by this caller and is known PENDING.
        None: no such task (or, without a first read, not finished within the time).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
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


class ResultWaiters:
    """Every open wait of this process, by task id."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self._watches: dict[bytes, list[Watch]] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._watches.values())

    @contextmanager
    def watch(self, task_id: str, read: Reader | None = None) -> Iterator[Watch]:
        """Register a wait for ``task_id`` for the duration of the block (reading the record
        with ``read``, if given: an owner's read)."""
        key = task_id.encode()
        watch = Watch(task_id, read or self.read)
        self._watches.setdefault(key, []).append(watch)
        try:
            yield watch
        finally:
            watches = self._watches.get(key)
            if watches is not None:
                watches.remove(watch)
                if not watches:
                    del self._watches[key]

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
