"""What the batcher's loops share: the work it holds, and the signals they give each other.

The reader boards into the buffer and marks entries held; the dispatcher takes from the buffer
and keeps the batches at Triton; the keeper keeps held entries alive; ``stop()`` hands back what
is left. Each reaches this state through one object handed to it, never through the batcher.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.rules.buffer import BoardingBuffer
from ferry.rules.policy import Lane

Batches = dict[asyncio.Task[None], tuple[Lane, list[Delivery]]]


def client_of(delivery: Delivery) -> str:
    """A boarded task's client (its flow in the buffer: the lane is its model already)."""
    return delivery.task.client_id if delivery.task is not None else ""


class Shared:
    """The boarding buffer, the held entries, the batches in flight, cancellations, signals."""

    def __init__(self) -> None:
        self.buffer: BoardingBuffer[Delivery] = BoardingBuffer(flow=client_of)
        self.held: set[tuple[str, str]] = set()  # (stream, entry id) in the buffer or at Triton
        self.batches: Batches = {}  # at Triton: each batch's task, lane and deliveries
        self.cancelled: set[str] = set()  # ids a client cancelled, that this batcher may hold
        self.changed = asyncio.Event()  # boarded, a batch done, a loop ended: plan again
        self.slot_freed = asyncio.Event()  # wakes a parked reader
        self.room_freed = asyncio.Event()  # a batch left: the buffer has room again
        self.stopping = asyncio.Event()
        self.parked = False  # the reader waits for a slot to free
        self.ends: dict[asyncio.Task[None], float] = {}  # at Triton: each call's expected end
        self.read_ahead_at: float | None = None  # when the latest read-ahead started
        self.reading_ahead = False  # its boarding will wake the dispatcher
        self.feeders: list[asyncio.Task[None]] = []  # the loops that may board work

    def holding(self) -> set[Priority]:
        """Priorities of the tasks this batcher holds (boarded, or at Triton)."""
        held = set(self.buffer.count_by(lambda lane: lane.priority))
        held.update(lane.priority for lane, _ in self.batches.values())
        return held

    def feeders_done(self) -> bool:
        """No loop is left that could board more work."""
        return all(task.done() for task in self.feeders)

    def stop(self) -> None:
        """Tell every loop to stop, and wake those that wait."""
        self.stopping.set()
        self.changed.set()
        self.slot_freed.set()
        self.room_freed.set()

    def unfinished(self) -> list[Delivery]:
        """What was boarded or sent and has no answer: to be handed back (empties the buffer)."""
        sent = [d for task, (_, batch) in self.batches.items() if not task.done() for d in batch]
        return sent + self.buffer.drain()


async def wait(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait for ``event`` up to ``timeout_s`` (None: for ever); whether it is set.

    ``asyncio.timeout`` costs a timer, where ``wait_for`` also costs a task: this is on the
    dispatcher's path for every batch. It always yields once, so that a loop waiting on an event
    that is already set still lets the task that will clear it run.
    """
    if event.is_set():
        await asyncio.sleep(0)
    else:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
    return event.is_set()


async def wait_any(events: tuple[asyncio.Event, ...], timeout_s: float | None) -> None:
    """Wait until any of ``events`` is set, up to ``timeout_s`` (None: for ever)."""
    if any(event.is_set() for event in events):
        await asyncio.sleep(0)
        return
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class Rounds:
    """A background loop's rounds, counted: what a test or a probe waits on to know that the
    loop has run since it asked, instead of sleeping for the loop's interval."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0
        self._ended = asyncio.Event()  # set when a round ends, then replaced by a fresh one

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """One round: the block (it ends however the block ends)."""
        self.started += 1
        try:
            yield
        finally:
            self.ended += 1
            self._ended.set()
            self._ended = asyncio.Event()

    async def next(self, timeout_s: float) -> None:
        """Return once a round that began after this call has ended (``TimeoutError`` after
        ``timeout_s``)."""
        target = self.started + 1
        async with asyncio.timeout(timeout_s):
            while self.ended < target:
                await self._ended.wait()
