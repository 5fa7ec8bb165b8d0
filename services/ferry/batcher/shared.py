"""What the batcher's loops share. Each piece has one owner, the part that changes it; the
others ask it questions or tell it what happened, and no loop sets another's fields.

- ``Aboard``: the work boarded and waiting for its batch, every entry held (boarded, or in a
  batch at Triton: kept alive until answered), and the ids a client cancelled. The reader
  boards (``board``, ``took_over``); the dispatcher takes batches (``take``), lets their entries
  go once answered (``let_go``) and ends cancelled tasks (``cancel``, ``cancel_settled``); the
  fleet's boarding (``riders.py``) drops what another batcher took (``drop``); ``stop()`` hands
  back what is left (``drain``).
- ``AtTriton``: the batches at Triton and when each call should end. The dispatcher's
  (``launched``, ``expect_end``, ``done_at_triton``, ``landed``); the reader asks which
  priorities are there and when the next call ends, ``stop()`` which batches to wait for.
- ``ReadAhead``: the reader's pace (parked while every slot is busy, reading ahead just before
  one frees). The reader's own; the dispatcher only tells it that a batch left or a slot freed,
  and it wakes whoever that concerns.
- ``Signals``: the dispatcher's bell, rung by whoever saw what changes its plan (``boarded()``,
  ``batch_done()``...); the batches done at Triton that make way for the loop their freed slot
  woke; the batcher's stop, and the loops that may still board work.
- the gate (``gate.py``): whether Triton can be reached. The executor closes it, its own probe
  opens it; the others ask.

``Shared`` hands them to the loops as one, with the clock every time in them is on; nothing in
it is replaced once it is made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from ferry.batcher.gate import BackendGate
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.rules import readahead
from ferry.rules.buffer import BoardingBuffer
from ferry.rules.policy import Lane, Waiting

K = TypeVar("K")
CANCELLED_MEMORY = 10_000  # cancelled ids remembered for tasks this batcher has not seen


def client_of(delivery: Delivery) -> str:
    """A boarded task's client (its flow in the buffer: the lane is its model already)."""
    return delivery.task.client_id if delivery.task is not None else ""


class Aboard:
    """The work this batcher holds: boarded and waiting for its batch (the buffer), every entry
    held (boarded, or in a batch at Triton), and the ids of tasks a client cancelled."""

    def __init__(self) -> None:
        self._buffer: BoardingBuffer[Delivery] = BoardingBuffer(flow=client_of)
        self._held: set[tuple[str, str]] = set()  # (stream, entry id): boarded or at Triton
        self._cancelled: set[str] = set()  # ids a client cancelled, that this batcher may hold

    def __len__(self) -> int:
        """Tasks boarded and waiting for their batch."""
        return len(self._buffer)

    @property
    def held_count(self) -> int:
        """Entries held: boarded, or in a batch at Triton."""
        return len(self._held)

    def holds(self, model: str) -> bool:
        """Whether a task of ``model`` is boarded."""
        return self._buffer.holds(model)

    def is_held(self, delivery: Delivery) -> bool:
        return delivery.key in self._held

    def held(self) -> list[tuple[str, str]]:
        """Every entry held, for the keeper to keep alive."""
        return list(self._held)

    def count_by(self, key: Callable[[Lane], K]) -> dict[K, int]:
        """Tasks boarded, summed by ``key`` of their lane."""
        return self._buffer.count_by(key)

    def views(self, capacity: Callable[[Lane], int]) -> Iterator[Waiting]:
        """Each lane as the policy sees it (``capacity``: a lane's largest batch)."""
        return self._buffer.views(capacity)

    def items(self, model: str) -> Iterator[tuple[Lane, Delivery]]:
        """The model's boarded tasks, each with its lane."""
        return self._buffer.items(model)

    def lanes(self) -> list[Lane]:
        return self._buffer.lanes()

    def cancelled(self, delivery: Delivery) -> bool:
        """Whether a client cancelled the delivery's task."""
        return delivery.task is not None and delivery.task.task_id in self._cancelled

    # -- the reader's ---------------------------------------------------------------------------

    def board(self, lane: Lane, delivery: Delivery, arrived: float, due: float | None) -> None:
        """A task boards: held from now on, waiting in its lane."""
        self._held.add(delivery.key)
        self._buffer.add(lane, delivery, arrived, due)

    def took_over(self, cancelled: Iterable[str]) -> None:
        """Tasks taken over from another consumer, which a client asked to cancel."""
        self._cancelled.update(cancelled)

    # -- the dispatcher's -----------------------------------------------------------------------

    def take(self, lane: Lane, count: int) -> list[Delivery]:
        """A batch of the lane leaves for Triton (its entries stay held until ``let_go``)."""
        return self._buffer.take(lane, count)

    def let_go(self, deliveries: Iterable[Delivery]) -> None:
        """These entries are answered, or no longer this batcher's to keep alive."""
        held = self._held
        for delivery in deliveries:
            held.discard(delivery.key)

    def cancel(self, task_id: str) -> list[Delivery]:
        """A client cancelled the task: remembered (a batch that has left leaves it out of any
        retry), and taken out of the buffer if it waits here; what was taken out."""
        self._cancelled.add(task_id)
        removed = self._buffer.remove(lambda d: d.task is not None and d.task.task_id == task_id)
        if not removed and len(self._cancelled) > CANCELLED_MEMORY:
            self._cancelled.clear()  # ids of tasks held elsewhere: forget old ones
        return removed

    def cancel_settled(self, deliveries: Iterable[Delivery], *, settled: bool) -> None:
        """Cancelled tasks taken out of the buffer are ended (``settled``) or not: either way no
        longer kept alive (a reclaim settles an unsettled one)."""
        for delivery in deliveries:
            self._held.discard(delivery.key)
            if settled and delivery.task is not None:
                self._cancelled.discard(delivery.task.task_id)

    # -- the fleet's boarding, and stop() -------------------------------------------------------

    def drop(self, unwanted: Callable[[Delivery], bool]) -> list[Delivery]:
        """Boarded tasks that another batcher took: out of the buffer and no longer held."""
        removed = self._buffer.remove(unwanted)
        self.let_go(removed)
        return removed

    def drain(self) -> list[Delivery]:
        """Everything boarded, out of the buffer (to be handed back)."""
        return self._buffer.drain()


class AtTriton:
    """The batches at Triton: each batch's task, lane and deliveries, and, under load, when its
    call should end. The dispatcher's: it launches them and sees them end; the others ask."""

    def __init__(self) -> None:
        self._batches: dict[asyncio.Task[None], tuple[Lane, list[Delivery]]] = {}
        self._ends: dict[asyncio.Task[None], float] = {}  # each call's expected end

    def __len__(self) -> int:
        return len(self._batches)

    def __contains__(self, task: object) -> bool:
        return task in self._batches

    def lane(self, task: asyncio.Task[None]) -> Lane:
        """The lane of a batch at Triton."""
        return self._batches[task][0]

    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._batches)

    def priorities(self) -> set[Priority]:
        return {lane.priority for lane, _ in self._batches.values()}

    def ends(self) -> Iterable[float]:
        """When the calls under way should end (those expected: only under load)."""
        return self._ends.values()

    def unanswered(self) -> list[Delivery]:
        """What was sent and has no answer yet."""
        return [d for task, (_, batch) in self._batches.items() if not task.done() for d in batch]

    # -- the dispatcher's -----------------------------------------------------------------------

    def launched(self, task: asyncio.Task[None], lane: Lane, deliveries: list[Delivery]) -> None:
        self._batches[task] = (lane, deliveries)

    def expect_end(self, task: asyncio.Task[None], at: float) -> None:
        """The batch's call should end at ``at``: a parked reader reads ahead just before."""
        self._ends[task] = at

    def done_at_triton(self, task: asyncio.Task[None]) -> None:
        """Its call is over (its answers are still being written)."""
        self._ends.pop(task, None)

    def landed(self, task: asyncio.Task[None]) -> Lane:
        """The batch's task ended: no longer at Triton; its lane (``Lane('')`` if unknown)."""
        self._ends.pop(task, None)
        return self._batches.pop(task, (Lane(""), []))[0]


class Signals:
    """How the loops wake each other: the dispatcher's bell, rung for whatever changes what it
    would plan; the batches done at Triton that make way for the loop their freed slot woke;
    the batcher's stop, and the loops that may still board work."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()  # rung: the dispatcher plans again
        self._stopping = asyncio.Event()
        self._feeders: tuple[asyncio.Task[None], ...] = ()  # the loops that may board work
        self._making_way: list[asyncio.Future[None]] = []

    # -- what happened, told by whoever saw it ---------------------------------------------------

    def boarded(self) -> None:
        """Work boarded (read, taken over, or riders): the dispatcher plans with it."""
        self._changed.set()

    def unboarded(self) -> None:
        """Boarded work left without a batch of this batcher's (another batcher's took it)."""
        self._changed.set()

    def read_done(self) -> None:
        """A read the plan waited for is over (the reader caught up after a park, or the read
        failed): the dispatcher plans with what it brought."""
        self._changed.set()

    def batch_done(self) -> None:
        """A batch is done at Triton: its slot is free (rung as the reader's pace says:
        ``ReadAhead.slot_freed``)."""
        self._changed.set()

    def slots_changed(self) -> None:
        """The shared budget gave a slot, or an ask for one ended."""
        self._changed.set()

    def loop_ended(self) -> None:
        """A loop ended: the dispatcher sees whether any that may board work is left."""
        self._changed.set()

    def stop(self) -> None:
        """The batcher stops: the loops end, the dispatcher sends what has boarded."""
        self._stopping.set()
        self._changed.set()

    # -- waiting --------------------------------------------------------------------------------

    def planning(self) -> None:
        """The dispatcher plans now: what rang until now is in this round."""
        self._changed.clear()

    async def changed(self, timeout_s: float | None) -> bool:
        """Until the bell rings, up to ``timeout_s`` (None: for ever); whether it rang."""
        return await wait(self._changed, timeout_s)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def until_stopped(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` for the batcher to stop; whether it has."""
        return await wait(self._stopping, timeout_s)

    def feeding(self, loops: Iterable[asyncio.Task[None]]) -> None:
        """The loops that may board work (the worker's, once they run)."""
        self._feeders = tuple(loops)

    def fed(self) -> bool:
        """No loop is left that could board more work."""
        return all(task.done() for task in self._feeders)

    # -- making way -----------------------------------------------------------------------------

    def make_way(self) -> Awaitable[None]:
        """What a batch done at Triton awaits before it builds its answers, when its freed slot
        woke a loop that work waits for: done once that loop has taken its turn."""
        way = asyncio.get_running_loop().create_future()
        self._making_way.append(way)
        return way

    def way_made(self) -> None:
        """The woken loop has taken its turn: the dispatcher's round is over (a batch it
        launched was scheduled before the batches that made way resume, so it sends its call
        first: a task runs until it awaits), or the reader is awake (it reads before they
        resume). The batches that made way go on."""
        if self._making_way:
            ways, self._making_way = self._making_way, []
            for way in ways:
                if not way.done():
                    way.set_result(None)


class ReadAhead:
    """The reader's pace: parked while every slot is busy, it reads ahead just before the first
    batch at Triton is expected to end (``ferry.rules.readahead``), so the next batch is formed
    while the current one runs. The reader's own; the dispatcher tells it that a batch left
    (``batch_left``) or a slot freed (``slot_freed``), and asks the rest for its batch log."""

    def __init__(self, signals: Signals, at_triton: AtTriton, clock: Callable[[], float]) -> None:
        self._signals = signals
        self._at_triton = at_triton
        self._clock = clock
        self._slot_freed = asyncio.Event()  # wakes the parked reader
        self._room_freed = asyncio.Event()  # a batch left: the buffer has room again
        self._parked = False  # the reader waits for a slot to free
        self._reading = False  # a read-ahead is under way: its boarding will wake the dispatcher
        self._read_at: float | None = None  # when the latest read-ahead started
        self._read_s = readahead.READ_S_INITIAL  # a read-ahead's typical duration
        self._reads = 0  # read-aheads since a slot last freed

    @property
    def parked(self) -> bool:
        return self._parked

    @property
    def reading_ahead(self) -> bool:
        return self._reading

    @property
    def read_ahead_at(self) -> float | None:
        return self._read_at

    # -- the reader's ---------------------------------------------------------------------------

    def next_at(self) -> float | None:
        """When to read ahead for the next batch (None: no call is expected to end)."""
        return readahead.next_read(self._at_triton.ends(), readahead.lead(self._read_s),
                                   self._read_at, self._reads)

    def fresh(self) -> bool:
        """Whether the latest read-ahead is recent enough for the next batch to leave with it."""
        return readahead.fresh(self._read_at, self._clock())

    def watch_room(self) -> None:
        """From now on a batch that leaves wakes a reader parked for room (``park(room=...)``)."""
        self._room_freed.clear()

    async def park(self, timeout_s: float, *, room: bool = False) -> bool:
        """Until a slot frees, (with ``room``) a batch leaves, or ``timeout_s``; whether a slot
        freed and the batcher goes on. A slot that frees while every slot was busy (without
        ``room``) starts the count of read-aheads again."""
        self._parked = True
        self._slot_freed.clear()
        try:
            if room:
                await wait_any((self._slot_freed, self._room_freed), timeout_s)
            else:
                await wait(self._slot_freed, timeout_s)
        finally:
            self._parked = False
            self._signals.way_made()  # what made way for this wake-up goes on after the read
        freed = self._slot_freed.is_set() and not self._signals.stopping
        if freed and not room:
            self._reads = 0
        return freed

    def reading(self) -> float:
        """A read-ahead starts (a slot that frees before what it reads has boarded waits for
        it: ``slot_freed``); when it started."""
        self._reading = True
        return self._clock()

    def read(self, started: float) -> None:
        """The read-ahead that began at ``started`` is back: counted, and its time averaged."""
        self._read_at = started
        self._reads += 1
        self._read_s = readahead.average(self._read_s, self._clock() - started)

    def done(self) -> None:
        """What was read has boarded, or the read failed: a slot that frees now plans."""
        self._reading = False

    # -- the dispatcher's -----------------------------------------------------------------------

    def batch_left(self) -> None:
        """A batch left: the buffer has room again."""
        self._room_freed.set()

    def slot_freed(self) -> bool:
        """A batch's slot freed: wake whoever goes first; whether a loop was woken. Reading
        ahead, none: its boarding wakes the dispatcher, and the reader reads on. Awake, the
        dispatcher plans. Parked, the reader wakes; with a fresh read-ahead the dispatcher runs
        first (what was read ahead leaves now), then the reader, which catches up if a slot is
        still free."""
        if self._reading:
            return False
        if not self._parked:
            self._signals.batch_done()
            return True
        if self.fresh():
            self._signals.batch_done()
        self._slot_freed.set()
        return True

    def stop(self) -> None:
        """Wake a parked reader: the batcher stops."""
        self._slot_freed.set()
        self._room_freed.set()


@dataclass(frozen=True)
class Shared:
    """The pieces above, handed as one to the loops that share them; none is replaced."""

    aboard: Aboard
    at_triton: AtTriton
    read_ahead: ReadAhead
    signals: Signals
    gate: BackendGate
    clock: Callable[[], float]

    @classmethod
    def of(cls, gate: BackendGate, clock: Callable[[], float]) -> Shared:
        """Fresh state for a batcher, around its gate and clock."""
        signals, at_triton = Signals(), AtTriton()
        return cls(Aboard(), at_triton, ReadAhead(signals, at_triton, clock), signals, gate,
                   clock)

    def holding(self) -> set[Priority]:
        """Priorities of the tasks this batcher holds (boarded, or at Triton)."""
        held = set(self.aboard.count_by(lambda lane: lane.priority))
        held.update(self.at_triton.priorities())
        return held

    def stop(self) -> None:
        """Tell every loop to stop, and wake those that wait."""
        self.signals.stop()
        self.read_ahead.stop()

    def unfinished(self) -> list[Delivery]:
        """What was boarded or sent and has no answer: to be handed back (empties the buffer)."""
        return self.at_triton.unanswered() + self.aboard.drain()


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
