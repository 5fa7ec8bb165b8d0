"""The batching policy: a ferry leaves when it is full, when its departure time comes, or, when
the backend is idle, as soon as nobody else is coming.

Pure functions over plain values and a ``now`` the caller supplies, so that the same code drives the
batcher (with ``time.monotonic``) and can be tested or simulated with any clock.

The adaptive rule: a batch that is neither full nor due leaves now if its model has a free backend
slot and the next passenger is not expected within the time waiting for them could save. Waiting
for one more passenger saves one call's fixed cost shared by the ``n`` aboard (``fixed_s / n``
each); the next is expected ``1 / rate`` after the last arrival. So: leave if that expected arrival
is more than ``fixed_s / n`` away, or already overdue. Under load no slot is free, batches fill
while the backend works, and the rule never fires; when the backend idles, a lone request leaves
at once. Nothing ever waits longer than ``max_wait_s``.

Priorities: when queues compete for a model's free slots, the higher priority's go first, oldest
first within a priority. High priority always goes first, as Triton's priority levels do: it
rides the next batch that leaves. A queue that would wait for more passengers leaves at once
instead when a lower priority's batch would otherwise take the free slot. A normal or low queue
whose oldest request has waited ``aging_s`` goes ahead of every other normal and low queue
(oldest first among such), so that neither starves the other; only high-priority work, bounded
by its own share of the backlog, can hold them back.

Deadlines (a request's own, or its arrival plus the SLO, ``FERRY_SLO_MS``): no batch waits past
the latest moment that still answers its most urgent request in time, ``due - t(n + 1) - late -
guard`` (``late``: how far past t(B) nine calls in ten end; ``guard``: 10 ms or 15% of the time
the oldest was given, the larger, for what follows the call); it leaves then, reason
``deadline``. And when greedy batching would not hold the SLO, because at the arrival rate the
batch a free slot would take at once makes two calls longer than ``hold_share`` of the SLO, a
model with a batch already at the backend holds its free slot for passengers until that latest
moment (deferred batching, as Clockwork and Symphony do): the other instances keep the backend
busy, and the batch that leaves is larger, so each call serves more. While it holds,
``max_wait_s`` does not bound the wait; the deadline does. A model with nothing at the backend
never holds: no GPU idles while work waits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from ferry.priority import Priority

LOADED_SHARE = 0.5  # of a model's capacity: above it, work that waited for a freed slot takes it
FREED_SHARE = 0.5  # ... when at least this share of the batch greedy batching takes at the rate
HOLD_SHARE = 0.85  # hold for the deadline when greedy's two calls take more of the SLO than this
GUARD_S = 0.010  # what a batch leaves for writing results and waking the client after its call
GUARD_SHARE = 0.15  # ... or this share of the time it was given, the larger
RANKS = {Priority.HIGH: 3, Priority.NORMAL: 1, Priority.LOW: 0, Priority.BATCH: -1}
AGED_RANK = 2  # an aged normal or low queue: behind high, ahead of every other
NEVER_AGED = frozenset({Priority.HIGH, Priority.BATCH})  # high needs not; batch fills only


class Lane(NamedTuple):
    """A boarding queue: requests that may travel together."""

    model: str
    priority: Priority = Priority.NORMAL
    suspect: bool = False  # reclaimed after a batcher died holding it: it travels alone
    # What a tensor task's batch-mates must share (model version, inputs' datatypes and
    # non-batch shapes, outputs asked for); empty for a one-BYTES task.
    signature: tuple[object, ...] = ()


class Reason(StrEnum):
    """Why a batch left."""

    FULL = "full"
    WAIT = "wait"  # its first request waited max_wait_s
    ADAPTIVE = "adaptive"  # a backend slot was free and nobody else was coming soon
    PRIORITY = "priority"  # waiting longer would have given its free slot to lower priority
    DEADLINE = "deadline"  # waiting longer would answer its most urgent request too late
    FREED = "freed"  # a slot freed with work waiting for it: taken at once, as Triton's own queue
    DRAIN = "drain"  # the batcher is stopping


@dataclass(frozen=True)
class Waiting:
    """What one lane's queue looks like to the policy."""

    lane: Lane
    count: int  # requests waiting
    oldest: float  # arrival time of the first of them, on the caller's clock
    newest: float  # arrival time of the last of them
    capacity: int  # the largest batch the lane takes (the model's max_batch_size; 1 for suspects)
    due: float | None = None  # the earliest time one of them should be answered (its deadline,
    # or its arrival plus the SLO), on the caller's clock; None: no deadline and no SLO


@dataclass(frozen=True)
class Backend:
    """What the policy knows about a model's backend now."""

    free: int  # batches that may start now (instances not busy with this batcher's batches)
    rate: float = 0.0  # arrivals per second for the model
    fixed_s: float = 0.0  # the fixed part of one call's time (what a shared call saves)
    per_item_s: float = 0.0  # what each request adds to a call's time
    slots: int = 1  # batches of the model that may be at the backend at once
    late_s: float = 0.0  # how far past t(B) calls run (90% of them within it)
    freed: bool = False  # a slot freed while every one was busy, and no batch has left since
    taken: bool = False  # a slot of the fleet's shared budget was taken for it: what waits in
    # the fleet's one queue leaves at once, as a free instance takes it at Triton

    def call_s(self, size: float) -> float:
        """The fitted time of a call of ``size`` requests (0 while no call was seen)."""
        return self.fixed_s + self.per_item_s * size

    def greedy_batch(self) -> float:
        """The batch a free slot takes at once, in the steady state of greedy batching at the
        arrival rate: B = rate · t(B) / slots, so B = rate · fixed / (slots - rate · per_item);
        infinite when the slots cannot keep up at any batch size."""
        spare = self.slots - self.rate * self.per_item_s
        return self.rate * self.fixed_s / spare if spare > 0 else math.inf


@dataclass(frozen=True)
class Departure:
    lane: Lane
    size: int
    reason: Reason


@dataclass(frozen=True)
class Plan:
    """What to send now, and when to look again."""

    flush: tuple[Departure, ...]  # most urgent first
    wake_in: float | None  # seconds until a waiting batch may leave; None: nothing waits


@dataclass(frozen=True)
class BatchPolicy:
    """``max_batch`` requests at once, or whatever waited ``max_wait_s``, or earlier when idle."""

    max_batch: int
    max_wait_s: float
    adaptive: bool = True
    aging_s: float = 2.0
    hold_share: float = HOLD_SHARE
    guard_s: float = GUARD_S
    guard_share: float = GUARD_SHARE

    def urgency(self, queue: Waiting, now: float) -> tuple[int, float]:
        """Sort key, most urgent first: high, then aged queues, then by priority; oldest first
        within each. Batch work never ages: it fills what interactive work leaves."""
        priority = queue.lane.priority
        aged = priority not in NEVER_AGED and now - queue.oldest >= self.aging_s
        return -(AGED_RANK if aged else RANKS[priority]), queue.oldest

    def limit(self, capacity: int) -> int:
        """The batch size for a lane that takes at most ``capacity`` per call."""
        return max(1, min(self.max_batch, capacity))

    def due_at(self, queue: Waiting) -> float:
        """When the queue's departure falls due, on the caller's clock."""
        return queue.oldest + self.max_wait_s

    def plan(self, queues: Iterable[Waiting], now: float, backends: Mapping[str, Backend],
             *, draining: bool = False) -> Plan:
        """Batches to send now, within each model's free slots, and the wait until the next.

        A queue holding several full batches yields them all. Queues are served by urgency.
        When a batch that may leave finds no free slot, ``wake_in`` is 0: send it as soon as a
        slot frees.
        """
        free = {model: backend.free for model, backend in backends.items()}
        flush: list[Departure] = []
        wake_in: float | None = None
        waiting = sorted((q for q in queues if q.count > 0), key=lambda q: self.urgency(q, now))
        for index, queue in enumerate(waiting):
            model = queue.lane.model
            backend = backends.get(model, Backend(free=0))
            ready = self._departures(queue, now, backend, free.get(model, 0), draining)
            room = max(0, free.get(model, 0))
            rest = queue.count - sum(d.size for d in ready)
            if rest > 0 and len(ready) < room and self._overtaken(
                    queue, waiting[index + 1:], now, backends, room=room - len(ready),
                    draining=draining):
                ready.append(Departure(queue.lane, rest, Reason.PRIORITY))
            flush.extend(ready[:room])
            free[model] = room - len(ready[:room])
            if queue.count - sum(d.size for d in ready[:room]) <= 0:
                continue
            wait = 0.0 if len(ready) > room else self._next_look(queue, now, backend,
                                                                  free[model])
            wake_in = wait if wake_in is None else min(wake_in, wait)
        return Plan(tuple(flush), wake_in)

    def _overtaken(self, queue: Waiting, others: list[Waiting], now: float,
                   backends: Mapping[str, Backend], *, room: int, draining: bool) -> bool:
        """Whether a queue of a lower priority would take the model's free slot that ``queue``
        leaves while it waits for more passengers: then ``queue`` leaves now, as it is."""
        model, rank = queue.lane.model, self.urgency(queue, now)[0]
        backend = backends.get(model, Backend(free=0))
        return any(other.lane.model == model and self.urgency(other, now)[0] > rank
                   and self._departures(other, now, backend, room, draining)
                   for other in others)

    def _departures(self, queue: Waiting, now: float, backend: Backend, free: int,
                    draining: bool) -> list[Departure]:
        """What ``queue`` should send now: its full batches, then the rest if it may leave."""
        limit = self.limit(queue.capacity)
        full, rest = divmod(queue.count, limit)
        departures = [Departure(queue.lane, limit, Reason.FULL)] * full
        if not rest:
            return departures
        latest = self.latest(queue, backend, rest)
        if draining:
            departures.append(Departure(queue.lane, rest, Reason.DRAIN))
        elif latest is not None and now >= latest:
            departures.append(Departure(queue.lane, rest, Reason.DEADLINE))
        elif free > full and self._holds(queue, backend, busy=backend.slots - free + full):
            pass  # another batch keeps the backend busy: this one waits for more, in time
        elif now >= self.due_at(queue):
            departures.append(Departure(queue.lane, rest, Reason.WAIT))
        elif free > full and self._takes_freed_slot(queue, backend, rest):
            departures.append(Departure(queue.lane, rest, Reason.FREED))
        elif free > full and self._nobody_coming(rest, queue.newest, now, backend):
            departures.append(Departure(queue.lane, rest, Reason.ADAPTIVE))
        return departures

    def latest(self, queue: Waiting, backend: Backend, aboard: int) -> float | None:
        """The last moment a batch of ``aboard`` (and one more passenger) may leave and still
        answer the queue's most urgent request by its due time; None: nothing is due."""
        if queue.due is None:
            return None
        guard = max(self.guard_s, self.guard_share * (queue.due - queue.oldest))
        limit = self.limit(queue.capacity)
        slack = queue.due - backend.late_s - guard
        now_size = slack - backend.call_s(min(aboard + 1, limit))
        if aboard + 1 >= limit or backend.rate <= 0:
            return now_size
        # Those expected to board while it waits (rate · (L - newest)) lengthen its call: solve
        # L = slack - t(aboard + 1 + rate · (L - newest)) for L, so that a read delivering them
        # at once does not find L already past; never earlier than a full batch's own latest.
        grow = backend.per_item_s * backend.rate
        growing = (now_size + grow * queue.newest) / (1.0 + grow)
        return min(now_size, max(growing, slack - backend.call_s(limit)))

    def _takes_freed_slot(self, queue: Waiting, backend: Backend, aboard: int) -> bool:
        """Whether what waited for a slot that freed leaves at once: under load, and when it is
        at least half the batch that greedy batching takes at this arrival rate (a handful
        that boarded just after another instance's batch left waits for company rather than
        take an instance for a whole call); or whatever it is, at any load, when the slot was
        taken from the fleet's shared budget for it (asked for by a departure, or by work
        waiting under load: the batch holds the whole fleet's queue, as Triton's own batcher
        takes everything queued when an instance frees)."""
        if backend.taken:
            return True
        if not (self.adaptive and backend.freed and self.loaded(queue.capacity, backend)):
            return False
        greedy = min(backend.greedy_batch(), float(self.limit(queue.capacity)))
        return aboard >= FREED_SHARE * greedy

    def loaded(self, capacity: int, backend: Backend) -> bool:
        """Whether the model's arrivals take more than ``LOADED_SHARE`` of its capacity at full
        batches (of at most ``capacity``): then an instance idling while work waits costs
        capacity that is needed (below it, the adaptive flush's wait for one more passenger
        saves a call's fixed cost and costs nothing, and a read ahead would cost a read)."""
        limit = self.limit(capacity)
        return backend.rate * backend.call_s(limit) >= LOADED_SHARE * limit * backend.slots

    def _holds(self, queue: Waiting, backend: Backend, *, busy: int) -> bool:
        """Whether a free slot waits for more passengers, up to the deadline: only while another
        batch of the model is at the backend (``busy``), and only when greedy batching would not
        hold the SLO at this arrival rate."""
        if queue.due is None or busy <= 0 or backend.rate <= 0 or backend.call_s(1) <= 0:
            return False
        greedy = min(backend.greedy_batch(), float(self.limit(queue.capacity)))
        span = queue.due - queue.oldest
        return 2 * backend.call_s(greedy) > self.hold_share * span

    def _nobody_coming(self, aboard: int, last: float, now: float, backend: Backend) -> bool:
        """The next passenger is not expected within what waiting for them could save."""
        if not self.adaptive:
            return False
        if backend.rate <= 0:
            return True
        expected = last + 1.0 / backend.rate
        return now >= expected or expected - now > backend.fixed_s / aboard

    def _next_look(self, queue: Waiting, now: float, backend: Backend, free: int) -> float:
        """Seconds until ``queue``'s remainder may leave: at its due time, or, while a slot is
        free, when its next passenger is overdue."""
        at = self.due_at(queue)
        latest = self.latest(queue, backend, queue.count % self.limit(queue.capacity))
        if latest is not None and free > 0 and self._holds(queue, backend,
                                                           busy=backend.slots - free):
            return max(0.0, latest - now)
        if latest is not None:
            at = min(at, latest)
        if self.adaptive and free > 0 and backend.rate > 0:
            at = min(at, queue.newest + 1.0 / backend.rate)
        return max(0.0, at - now)
