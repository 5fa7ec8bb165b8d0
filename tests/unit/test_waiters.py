"""Completion announcements: the frames batchers publish, as the gateway reads them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ferry import keys
from ferry.tasks import waiters as waiters_module
from ferry.tasks.record import Announcement, Status, StoredRecord, announcements
from ferry.tasks.waiters import ResultWaiters

A = "0123456789abcdef0123456789abcdef"
B = "fedcba9876543210fedcba9876543210"


def frame(task_id: str, status: str, body: bytes, inline: bool = True) -> bytes:
    """What the completion script writes for one task (n = 0: the body is not inlined)."""
    if not inline:
        return f"{task_id} {status} 0 ".encode()
    return f"{task_id} {status} {len(body)} ".encode() + body


def test_one_frame_with_its_record() -> None:
    body = b'{"task_id": "x", "status": "SUCCESS"}'
    assert list(announcements(frame(A, "SUCCESS", body))) == [
        Announcement(A.encode(), Status.SUCCESS, body)]
    assert Announcement(A.encode(), Status.SUCCESS, body).record == StoredRecord(
        Status.SUCCESS, body)


def test_several_frames_bodies_may_hold_spaces_newlines_and_digits() -> None:
    first = b'{"output": "a b\n 12 34"}'
    second = b"[1, 2, 3]"
    data = frame(A, "FAILED", first) + frame(B, "EXPIRED", second)
    assert [(a.task_id, a.record) for a in announcements(data)] == [
        (A.encode(), StoredRecord(Status.FAILED, first)),
        (B.encode(), StoredRecord(Status.EXPIRED, second))]


def test_a_large_body_is_announced_without_it() -> None:
    data = frame(A, "SUCCESS", b"", inline=False) + frame(B, "SUCCESS", b"{}")
    assert list(announcements(data)) == [
        Announcement(A.encode(), Status.SUCCESS, None),
        Announcement(B.encode(), Status.SUCCESS, b"{}")]
    assert next(a.record for a in announcements(data)) is None


def test_an_empty_announcement_names_no_task() -> None:
    assert list(announcements(b"")) == []


def test_a_garbled_announcement_raises() -> None:
    with pytest.raises(ValueError):
        list(announcements(A.encode() + b" SUCCESS notanumber {}"))


async def test_a_garbled_announcement_makes_every_waiter_read_again() -> None:
    reads: list[str] = []
    first_read = asyncio.Event()

    async def read(task_id: str) -> StoredRecord | None:
        reads.append(task_id)
        first_read.set()
        return StoredRecord(Status.SUCCESS, b"{}") if len(reads) > 1 else StoredRecord(
            Status.PENDING, b"{}")

    waiters = ResultWaiters(read)
    with waiters.watch(A) as watch:
        waiting = asyncio.create_task(watch.final(5.0))
        await asyncio.wait_for(first_read.wait(), 1.0)  # it read PENDING: it waits
        waiters.on_announcement(A.encode() + b" SUCCESS notanumber {}")
        record = await asyncio.wait_for(waiting, 1.0)
    assert record == StoredRecord(Status.SUCCESS, b"{}")
    assert reads == [A, A]
    assert len(waiters) == 0


class FakeChannels:
    """Where a ResultWaiters subscribes (the Subscriber's two calls): confirmations by hand."""

    def __init__(self) -> None:
        self.subscribed: list[str] = []
        self.unsubscribed: list[str] = []
        self.confirming: dict[str, asyncio.Future[None]] = {}

    def subscribe(self, channel: str) -> asyncio.Future[None] | None:
        self.subscribed.append(channel)
        if channel not in self.confirming:
            self.confirming[channel] = asyncio.get_running_loop().create_future()
        return self.confirming[channel]

    def unsubscribe(self, channel: str) -> None:
        self.unsubscribed.append(channel)
        self.confirming.pop(channel, None)


def tagged(tag: str) -> str:
    return "0123456789abcdef0123456789ab" + tag


async def test_a_wait_for_this_processs_task_subscribes_to_nothing() -> None:
    channels = FakeChannels()
    waiters = ResultWaiters(lambda _: _pending(), channels)
    with waiters.watch(tagged(keys.process_tag())) as watch:
        assert watch.heard is None
    assert channels.subscribed == [] and channels.unsubscribed == []


async def test_another_processs_channel_is_shared_by_its_waits_and_dropped_after_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiters_module, "LINGER_S", 0.05)
    other = "beef" if keys.process_tag() != "beef" else "f00d"
    channel = keys.done_channel(other)
    channels = FakeChannels()
    waiters = ResultWaiters(lambda _: _pending(), channels)
    with waiters.watch(tagged(other)), waiters.watch("f" * 28 + other):
        assert channels.subscribed == [channel, channel]
    assert channels.unsubscribed == []  # it lingers: a GET from there may follow
    # The linger is a timer of the loop's: one due at 0.05 s has run before a sleep of 0.1 s
    # begun after it ends (the loop runs timers in order), however slow the machine.
    with waiters.watch(tagged(other)):  # taken up again within the linger: kept
        await asyncio.sleep(0.1)
    assert channels.unsubscribed == []  # the linger's time came: it was cancelled
    await asyncio.sleep(0.1)  # past the new linger: time itself must pass
    assert channels.unsubscribed == [channel]


async def test_a_wait_on_another_channel_reads_once_it_is_confirmed() -> None:
    """Known PENDING by the caller, but read again: its end may have gone unheard until the
    subscription was confirmed."""
    reads: list[str] = []

    async def read(task_id: str) -> StoredRecord | None:
        reads.append(task_id)
        return StoredRecord(Status.SUCCESS, b"{}")

    other = "beef" if keys.process_tag() != "beef" else "f00d"
    channels = FakeChannels()
    waiters = ResultWaiters(read, channels)
    with waiters.watch(tagged(other)) as watch:
        waiting = asyncio.create_task(watch.final(5.0, StoredRecord(Status.PENDING, b""),
                                                  read_first=False))
        await turns()
        assert reads == []  # not before the channel is confirmed
        channels.confirming[keys.done_channel(other)].set_result(None)
        record = await asyncio.wait_for(waiting, 1.0)
    assert record == StoredRecord(Status.SUCCESS, b"{}") and reads == [tagged(other)]


async def _pending() -> StoredRecord | None:
    return StoredRecord(Status.PENDING, b"{}")


class EarlyWatch:
    """A watch whose wait ends at once with the task still pending, as a loop's timer may end
    it a hair before the wall clock reaches the deadline."""

    task_id = A

    async def final(self, timeout_s: float, known: StoredRecord | None = None, *,
                    read_first: bool = True) -> StoredRecord | None:
        return StoredRecord(Status.PENDING, b"{}")


async def test_a_hold_the_deadline_ends_expires_the_task_once_the_deadline_has_passed() -> None:
    called: list[float] = []

    async def expire(task_id: str) -> StoredRecord | None:
        called.append(time.time())
        return StoredRecord(Status.EXPIRED, b"{}")

    watch: Any = EarlyWatch()
    due = time.time() + 0.05
    record = await waiters_module.final_by(watch, 10.0, due, expire)
    assert record is not None and record.status is Status.EXPIRED
    assert len(called) == 1 and called[0] >= due  # never before its deadline
    plain = await waiters_module.final_by(watch, 0.01, time.time() + 60, expire)
    assert plain is not None and plain.status is Status.PENDING  # the wait's end, not the due
    assert len(called) == 1


async def turns(count: int = 10) -> None:
    """Let the loop run what is ready ``count`` times over: a wait's steps that need no timer
    and no I/O (a read here answers at once) have all run by then, however slow the machine,
    which a sleep of some milliseconds does not promise."""
    for _ in range(count):
        await asyncio.sleep(0)
