"""A model's in-flight budget, counted once for the whole fleet.

A model may have as many of Ferry's batches at Triton at once as Triton runs instances of it,
over every server of the pool (``triton.pool``), each server at most its own instances. With
one batcher alive that is counted here, in the process (``local``: no Redis call per batch).
With several, in Redis (``shared``): a batch leaves only with a slot taken from the model's
budget (``lua/budget_take.lua``), on the server the slot names; a batcher that finds none free
waits in the model's queue, first come first served, and takes the next slot that frees (a
message on ``keys.BUDGET_CHANNEL`` tells it, and it asks again at least every
``ASK_EVERY_S``).

One queue for the fleet: a batcher that waits offers the tasks it holds for the model, and the
batcher that takes the next slot takes them with it, as riders (``Boarding``: they move to it in
Redis, ``RedisStreamQueue.take_riders``, and board its batch). So the batch that leaves holds
everything that boarded anywhere meanwhile, the batch one queue in front of the pool would make,
and no task waits for another batcher's call as well as for its own: with four batchers on one
instance a task waits for one call, not four. An offer is taken by one batcher at most, and
never once its owner has a slot (the same script decides both); the owner drops what was taken
from it at its next call, which the budget channel makes at once.

A slot lapses a lease after it was taken unless renewed (every fifth of a lease, with the
batcher's own heartbeat): a batcher that dies frees its slots within a lease, as its tasks are
rescued. ``FERRY_INFLIGHT_BUDGET`` picks: ``auto`` (shared while more than one batcher holds a
live lease), ``shared`` or ``local``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ferry.batcher.shared_budget import LOCAL, SharedBudget, Slot
from ferry.errors import RedisUnavailableError

log = logging.getLogger(__name__)
batches_log = logging.getLogger("ferry.batches")  # a line per slot taken, at DEBUG
ASK_EVERY_S = 0.1  # a waiting batcher asks again this often, even with no message
OFFER_EVERY_S = 0.005  # what boards is offered at most this often (a call per boarding is
# a Redis call per task; what boards in the last few ms before a slot frees rides the next)
PULL_LEAD = 0.25  # a holder pulls riders in the last quarter of its call's expected time
PULL_LEAD_MIN_S = 0.02  # and at least this long before its expected end
MODES = ("auto", "shared", "local")


class Boarding(Protocol):
    """The batcher's boarded work, as its budget offers and takes it."""

    def offers(self, model: str) -> list[tuple[str, float]]:
        """The model's boarded tasks that may ride another batcher's batch: ("stream|entry
        id", place), high priority first, then oldest first."""
        ...

    def room(self, model: str) -> int:
        """How many riders a batch of the model could take, beside what has boarded here."""
        ...

    def largest(self, model: str) -> int:
        """The most tasks a batch of the model carries."""
        ...

    def waiting(self, model: str) -> bool:
        """Whether a task of the model is boarded here."""
        ...

    def gone(self, model: str, members: set[str]) -> None:
        """Another batcher took these boarded tasks: they are no longer held here."""
        ...

    async def riders(self, model: str, riders: list[tuple[str, str, str]]) -> None:
        """Move the riders (owner, stream, entry id) here and board them."""
        ...


def _running(desk: _Desk) -> bool:
    return desk.task is not None and not desk.task.done()


@dataclass
class _Desk:
    """A model's dealings with the shared budget: the task that asks for slots and offers the
    model's tasks, the bell that wakes it, and what it has offered."""

    bell: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    since: float = 0.0  # when it began to want a slot
    wants: bool = False  # a batch waits for a slot
    told: bool = False  # the budget channel spoke of the model: others may have taken offers
    queued: bool = False  # its last ask left it in the queue
    last: float = -math.inf  # when it last asked or offered
    pulled: float = -math.inf  # when it last took riders while a batch of its ran
    giving: list[Slot] = field(default_factory=list)  # done: given back with its next ask
    offered: set[str] = field(default_factory=set)  # "stream|entry id" offered, not taken


class Budget:
    """This batcher's side of every model's budget: the slots it took and has not used yet,
    those its batches hold, and the asks under way."""

    def __init__(self, shared: SharedBudget | None, *, mode: str = "auto",
                 limits: Callable[[str], Mapping[str, int]],
                 wake: Callable[[], None], clock: Callable[[], float],
                 waited: Callable[[str, float], None] = lambda model, seconds: None,
                 boarding: Boarding | None = None) -> None:
        self.shared_budget = shared
        self.boarding = boarding  # None: this batcher's tasks wait for its own slots
        self.mode = mode if shared is not None else "local"
        self.limits = limits
        self.wake = wake
        self.clock = clock
        self.waited = waited
        self.live = 1  # batchers holding a live lease, as the last look saw
        self._shared_until = 0.0  # auto: shared until then since others were last seen
        self.granted: dict[str, list[Slot]] = {}  # taken, for the model's next batch
        self.held: set[Slot] = set()  # in use by batches at Triton
        self._pull_from: dict[Slot, float] = {}  # when a held slot's batch wants riders
        self._desks: dict[str, _Desk] = {}
        self._giving: set[asyncio.Task[None]] = set()

    @property
    def shared(self) -> bool:
        """Whether slots come from Redis now."""
        return self.mode == "shared" or (self.mode == "auto" and (
            self.live > 1 or self.clock() < self._shared_until))

    @property
    def fleet(self) -> int:
        """Batchers whose work one slot's batch may carry: the live ones while the budget is
        shared with riders, else this one."""
        return max(1, self.live) if self.shared and self.boarding is not None else 1

    def saw(self, live: int, hold_s: float) -> None:
        """``live`` batchers hold a lease now. Auto: shared at once when others are seen, and
        for ``hold_s`` after they were last seen (a late heartbeat, a busy loop, is not the
        fleet gone: counting alone too soon would send batches past the budget)."""
        self.live = live
        if live > 1:
            self._shared_until = self.clock() + hold_s

    def asking(self, model: str) -> bool:
        """Whether a batch of the model waits for a slot of the shared budget."""
        desk = self._desks.get(model)
        return desk is not None and desk.wants and _running(desk)

    def holding(self, model: str) -> bool:
        """Whether a batch of the model is at Triton from here, on a slot of the budget."""
        return any(slot.model == model and slot.token for slot in self.held)

    def free(self, model: str) -> int:
        """Slots taken for the model's next batches."""
        return len(self.granted.get(model, ()))

    def slot(self, model: str) -> Slot | None:
        """A slot for a batch of ``model`` leaving now: a local one, or one taken from the
        shared budget (None: none yet; ``ask`` for one)."""
        if not self.shared:
            return LOCAL
        granted = self.granted.get(model)
        if not granted:
            return None
        slot = granted.pop(0)
        self.held.add(slot)
        if self.boarding is not None:  # its desk takes riders while the batch runs
            self._desk(model, functools.partial(self.boarding.waiting, model))
        return slot

    def expect(self, slot: Slot, seconds: float) -> None:
        """``slot``'s batch left now and should be done at Triton in ``seconds``: riders
        taken for its model's next batch need to be aboard only by then, so pulls wait for
        the call's last stretch (``PULL_LEAD``). A batch with no expected time pulls
        throughout its call."""
        if slot in self.held and seconds > 0:
            lead = max(PULL_LEAD * seconds, PULL_LEAD_MIN_S)
            self._pull_from[slot] = self.clock() + seconds - lead

    def pulls_in(self, model: str) -> float:
        """Seconds until a batch of ``model`` held here wants riders (0: now)."""
        starts = [self._pull_from.get(slot, -math.inf) for slot in self.held
                  if slot.model == model and slot.token]
        return max(0.0, min(starts, default=0.0) - self.clock())

    def ask(self, model: str, wanted: Callable[[], bool]) -> None:
        """Ask for a slot of ``model`` until one is taken or ``wanted`` says no more."""
        if self.free(model):
            return
        desk = self._desk(model, wanted)
        if not desk.wants:
            desk.wants, desk.since = True, self.clock()
            desk.bell.set()

    def tend(self, models: Iterable[str]) -> None:
        """Offer what boarded since the last offer of each of ``models`` (those with work
        boarded here), and let every model's desk see whether its work is gone. Only while
        the budget is shared with other batchers, with riders; no Redis call when nothing
        boarded."""
        if self.fleet <= 1 or self.boarding is None:
            return
        for model in {*models, *(m for m, desk in self._desks.items() if _running(desk))}:
            self._desk(model, functools.partial(self.boarding.waiting, model)).bell.set()

    def _desk(self, model: str, wanted: Callable[[], bool]) -> _Desk:
        desk = self._desks.setdefault(model, _Desk())
        if not _running(desk):
            desk.wants = desk.told = desk.queued = False
            desk.task = asyncio.get_running_loop().create_task(
                self._deal(model, wanted, desk), name=f"ferry-budget-{model}")
        return desk

    def _fresh(self, model: str, desk: _Desk) -> list[tuple[str, float]]:
        """The model's boarded tasks not offered yet."""
        if self.boarding is None:
            return []
        return [offer for offer in self.boarding.offers(model) if offer[0] not in desk.offered]

    async def _deal(self, model: str, wanted: Callable[[], bool], desk: _Desk) -> None:
        """While the model has work here: ask for a slot when a batch waits for one, offer
        what boards meanwhile, drop what others took. One task per model, so that an offer
        never crosses the ask that takes its tasks (a grant takes its own offers off)."""
        assert self.shared_budget is not None
        riding = self.boarding is not None  # it takes riders while a batch of the model runs
        while (wanted() or (riding and self.holding(model))) and self.shared:
            desk.bell.clear()
            wait_s: float | None = None
            if not self.granted.get(model):  # else a batch is about to use the slot
                try:
                    wait_s = await self._call(model, desk)
                except RedisUnavailableError as exc:
                    log.warning("the shared budget of %s is out of reach: %s", model, exc)
                    wait_s = ASK_EVERY_S
            if not desk.bell.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(desk.bell.wait(), wait_s)
        if desk.giving or (self.shared and (desk.queued or desk.offered)):
            self._spawn(self.shared_budget.give(model, desk.giving, leave=True))
        desk.queued, desk.offered, desk.giving = False, set(), []
        self.wake()

    async def _call(self, model: str, desk: _Desk) -> float | None:
        """Ask or offer, as the model's work here needs, if it is time to; how long to wait for
        the bell. A waiter asks again at once when told (a slot freed somewhere), with fresh
        offers at most every ``OFFER_EVERY_S``, else every ``ASK_EVERY_S``; what boards while
        it does not wait is offered at most as often."""
        assert self.shared_budget is not None
        # With a batch of the model at Triton, what boards here waits for that call (another
        # batcher's slot would not take it: ``budget_ride``), and the others' offers ride it:
        # the next pull is due whatever else the desk waits for (an ask's answer waits up to
        # ``ASK_EVERY_S``, longer than the stretch in which a call pulls).
        busy = self.holding(model)
        pull_in: float | None = None
        if busy and self.boarding is not None:
            pull_in = await self._pull(model, desk)
            if not desk.wants:
                return pull_in
        waits = [w for w in (pull_in, await self._ask_or_offer(model, desk, busy))
                 if w is not None]
        return min(waits, default=None)

    async def _ask_or_offer(self, model: str, desk: _Desk, busy: bool) -> float | None:
        """Ask for a slot, or offer what boarded, if it is time to; how long to wait for the
        bell (None: until it rings)."""
        assert self.shared_budget is not None
        fresh = [] if busy else self._fresh(model, desk)
        if not (desk.wants or fresh or desk.told or desk.giving):
            return None
        if not desk.told and not desk.giving and (desk.queued or not desk.wants):
            due = desk.last + (OFFER_EVERY_S if fresh else ASK_EVERY_S)
            if self.clock() < due:
                return due - self.clock()
        desk.told, desk.last = False, self.clock()
        if not desk.wants:
            self._gone(model, desk, await self.shared_budget.offer(model, fresh))
            desk.offered.update(member for member, _ in fresh)
            return None
        return await self._ask_now(model, desk, fresh)

    async def _ask_now(self, model: str, desk: _Desk, fresh: list[tuple[str, float]]
                       ) -> float | None:
        """Ask for a slot (giving back the slots of batches done): granted, with its riders
        aboard, or in the queue with ``fresh`` offered."""
        assert self.shared_budget is not None
        room = self.boarding.room(model) if self.boarding is not None else 0
        giving, desk.giving = desk.giving, []
        try:
            taken = await self.shared_budget.take(model, self.limits(model), fresh, room,
                                                  giving)
        except RedisUnavailableError:
            self._spawn(self.shared_budget.give(model, giving))  # or they lapse in a lease
            raise
        self._gone(model, desk, taken.gone)
        if taken.slot is None:
            desk.queued = True
            desk.offered.update(member for member, _ in fresh)
            return ASK_EVERY_S
        desk.wants = desk.queued = False
        desk.offered = set()  # its own offers went off the set with the grant
        if taken.riders and self.boarding is not None:
            await self._riders(model, taken.riders)
        self.granted.setdefault(model, []).append(taken.slot)
        self.waited(model, self.clock() - desk.since)
        if batches_log.isEnabledFor(logging.DEBUG):
            batches_log.debug("slot at=%.4f model=%s endpoint=%s riders=%d waited_ms=%.1f",
                              self.clock(), model, taken.slot.endpoint, len(taken.riders),
                              (self.clock() - desk.since) * 1000)
        self.wake()
        return None

    async def _pull(self, model: str, desk: _Desk) -> float:
        """While a batch of the model runs here: bring the waiters' offers aboard, at most
        every ``OFFER_EVERY_S`` in the last stretch of its call (its next batch leaves on the
        same slot when the call ends: riders pulled sooner would only wait aboard). Those
        its next batch carries: up to its room, and beyond it those older than its own (a
        batcher that holds a batch's worth does not keep older work elsewhere waiting while
        it keeps the slot)."""
        assert self.shared_budget is not None and self.boarding is not None
        due = max(desk.pulled + OFFER_EVERY_S, self.clock() + self.pulls_in(model))
        if self.clock() < due:
            return due - self.clock()
        desk.pulled = self.clock()
        # Its next batch carries the oldest of what it holds and what waits elsewhere: with
        # no room left, a waiter's task older than its own still rides (in front of them).
        own = [place for _, place in self.boarding.offers(model)]
        riders = await self.shared_budget.pull(model, self.boarding.largest(model), own)
        if riders:
            await self._riders(model, riders)
        return OFFER_EVERY_S

    def _gone(self, model: str, desk: _Desk, gone: list[str]) -> None:
        """Others took these offers: they ride elsewhere, and are no longer held here."""
        if gone:
            desk.offered -= set(gone)
            if self.boarding is not None:
                self.boarding.gone(model, set(gone))

    async def _riders(self, model: str, riders: list[tuple[str, str, str]]) -> None:
        assert self.boarding is not None
        try:
            await self.boarding.riders(model, riders)
        except RedisUnavailableError as exc:  # still their owner's in Redis: reclaimed later
            log.warning("taking %d rider(s) of %s failed: %s", len(riders), model, exc)

    def ring(self, model: bytes) -> None:
        """A slot of ``model`` freed somewhere, or another batcher took offers (the budget
        channel): ask again now, or learn what was taken."""
        desk = self._desks.get(model.decode(errors="replace"))
        if desk is not None and _running(desk):
            desk.told = True
            desk.bell.set()

    def give(self, slot: Slot) -> None:
        """A batch's slot is free (its call is done at Triton). With riders, kept for the
        model's next batch while work of it is boarded here; else back to the shared budget:
        in the model's next ask when one waits (one call, and the slot may stay here), or at
        once."""
        self.held.discard(slot)
        self._pull_from.pop(slot, None)
        if not slot.token or self.shared_budget is None:
            return
        desk = self._desks.get(slot.model)
        if self.boarding is not None and self.boarding.waiting(slot.model):
            # One queue: it keeps the slot for its next batch, which carries the riders it
            # pulled while this one ran (no Redis call while the instance waits).
            if desk is not None and desk.queued:
                desk.queued = False
                self._spawn(self.shared_budget.give(slot.model, (), leave=True))
            if desk is not None:
                desk.wants = False
            self.granted.setdefault(slot.model, []).append(slot)
            self.wake()
        elif desk is not None and desk.wants and _running(desk):
            desk.giving.append(slot)
            desk.bell.set()
        else:
            self._spawn(self.shared_budget.give(slot.model, [slot]))

    def unused(self, models: Iterable[str]) -> None:
        """Give back the slots taken for ``models`` that no batch used (its work left)."""
        assert self.shared_budget is not None or not self.granted
        for model in models:
            slots = self.granted.pop(model, [])
            if slots and self.shared_budget is not None:
                self._spawn(self.shared_budget.give(model, slots))

    def _spawn(self, call: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(self._quietly(call))
        self._giving.add(task)
        task.add_done_callback(self._giving.discard)

    @staticmethod
    async def _quietly(call: Awaitable[None]) -> None:
        try:
            await call
        except RedisUnavailableError as exc:  # the slot lapses within a lease
            log.warning("giving a slot back failed: %s", exc)

    async def renew(self) -> None:
        """Another lease for every slot this batcher holds or has taken."""
        if self.shared_budget is None:
            return
        by_model: dict[str, list[Slot]] = {}
        for slot in [*self.held, *(s for g in self.granted.values() for s in g)]:
            if slot.token:
                by_model.setdefault(slot.model, []).append(slot)
        for model, slots in by_model.items():
            held = await self.shared_budget.renew(model, slots)
            if held < len(slots):
                log.warning("%d slot(s) of %s lapsed while in use (Redis was out of reach "
                            "for a lease?)", len(slots) - held, model)

    async def close(self) -> None:
        """Stop asking (leaving the queues: a waiter gone would keep others waiting for up to
        ``PATIENCE_MS``); give back every slot taken and not used."""
        for model, desk in self._desks.items():
            if desk.task is not None and _running(desk):
                desk.task.cancel()
                if self.shared_budget is not None:
                    self._spawn(self.shared_budget.give(model, desk.giving, leave=True))
        self.unused(list(self.granted))
        if self._giving:
            await asyncio.wait(list(self._giving), timeout=1.0)
