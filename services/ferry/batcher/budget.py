"""A model's in-flight budget, counted once for the whole fleet.

A model may have as many of Ferry's batches at Triton at once as Triton runs instances of it,
over every server of the pool (``triton.pool``), each server at most its own instances. With
one batcher alive that is counted here, in the process (``local``: no Redis call per batch).
With several, in Redis (``shared``): a batch leaves only with a slot taken from the model's
budget (``lua/budget_take.lua``), on the server the slot names; a batcher that finds none free
waits in the model's queue, first come first served, and takes the next slot that frees (a
message on ``keys.BUDGET_CHANNEL`` tells it, and it asks again at least every
``ASK_EVERY_S``). Its batch then holds everything that boarded meanwhile: two batchers sharing
one instance send batches as large as one queue in front of it would.

A slot lapses a lease after it was taken unless renewed (every fifth of a lease, with the
batcher's own heartbeat): a batcher that dies frees its slots within a lease, as its tasks are
rescued. ``FERRY_INFLIGHT_BUDGET`` picks: ``auto`` (shared while more than one batcher holds a
live lease), ``shared`` or ``local``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ferry import keys, lua
from ferry.errors import RedisUnavailableError
from ferry.resp.client import Commands

log = logging.getLogger(__name__)
ASK_EVERY_S = 0.1  # a waiting batcher asks again this often, even with no message
PATIENCE_MS = 1000  # a waiter that has not asked for this long leaves the queue
MODES = ("auto", "shared", "local")


class TakeKeys(NamedTuple):
    slots: str
    queue: str
    seen: str


class TakeArgs(NamedTuple):
    consumer: str
    token: str
    lease_ms: int
    patience_ms: int


class TakeItem(NamedTuple):
    endpoint: str
    limit: int


class GiveArgs(NamedTuple):
    consumer: str
    model: str
    leave: int


class RenewKeys(NamedTuple):
    slots: str


class RenewArgs(NamedTuple):
    lease_ms: int


class SlotItem(NamedTuple):
    slot: str


TAKE = lua.ScriptSpec("ferry.batcher", "budget_take", TakeKeys._fields, TakeArgs._fields,
                      item=TakeItem._fields)
GIVE = lua.ScriptSpec("ferry.batcher", "budget_give", TakeKeys._fields, GiveArgs._fields,
                      item=SlotItem._fields,
                      constants=(("BUDGET_CHANNEL", keys.BUDGET_CHANNEL),))
RENEW = lua.ScriptSpec("ferry.batcher", "budget_renew", RenewKeys._fields, RenewArgs._fields,
                       item=SlotItem._fields)


def _keys(model: str) -> TakeKeys:
    return TakeKeys(keys.budget_key(model, "slots"), keys.budget_key(model, "queue"),
                    keys.budget_key(model, "seen"))


@dataclass(frozen=True)
class Slot:
    """Room for one batch of ``model``: on ``endpoint`` ('': the pool picks), and in Redis
    under ``token`` ('': counted in this process only)."""

    model: str
    endpoint: str = ""
    token: str = ""

    @property
    def member(self) -> str:
        return f"{self.endpoint}|{self.token}"


LOCAL = Slot("")


def capped(limits: dict[str, int], cap: int) -> dict[str, int]:
    """``limits`` with at most ``cap`` slots in all, the largest servers' cut first."""
    cut = dict(limits)
    while sum(cut.values()) > cap:
        largest = max(cut, key=lambda name: cut[name])
        cut[largest] -= 1
    return {name: n for name, n in cut.items() if n > 0}


class SharedBudget:
    """The Redis side: take a slot or queue for one, give slots back, renew them."""

    def __init__(self, hot: Commands, consumer: str, *, lease_ms: int,
                 patience_ms: int = PATIENCE_MS) -> None:
        self.hot = hot
        self.consumer = consumer
        self.lease_ms = lease_ms
        self.patience_ms = patience_ms
        self._take = hot.register_script(lua.source(TAKE))
        self._give = hot.register_script(lua.source(GIVE))
        self._renew = hot.register_script(lua.source(RENEW))

    async def take(self, model: str, limits: Mapping[str, int]) -> Slot | None:
        """A slot of ``model`` on one of ``limits``' servers (each with its instances), or
        None: this batcher waits in the model's queue."""
        token = secrets.token_hex(6)
        servers = list(limits.items())
        random.shuffle(servers)  # of those with the most room, the script takes the first
        reply: Any = await self.hot.execute(*self._take.command(
            _keys(model), [*TakeArgs(self.consumer, token, self.lease_ms, self.patience_ms),
                           *lua.items(TakeItem(e, n) for e, n in servers)]))
        if int(reply[0]) != 1:
            return None
        endpoint = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        return Slot(model, endpoint, token)

    async def give(self, model: str, slots: Iterable[Slot], *, leave: bool = False) -> None:
        """Give ``model``'s slots back (telling its waiters); with ``leave``, leave its queue."""
        await self.hot.execute(*self._give.command(
            _keys(model), [*GiveArgs(self.consumer, model, int(leave)),
                           *lua.items(SlotItem(s.member) for s in slots)]))

    async def renew(self, model: str, slots: Iterable[Slot]) -> int:
        """Another lease for ``model``'s slots; how many were still held."""
        members = [SlotItem(s.member) for s in slots]
        if not members:
            return 0
        return int(await self.hot.execute(*self._renew.command(
            RenewKeys(keys.budget_key(model, "slots")),
            [*RenewArgs(self.lease_ms), *lua.items(members)])))


@dataclass
class _Asking:
    """A model's ask for a shared slot: the task that asks, and the bell that wakes it."""

    bell: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    since: float = 0.0


class Budget:
    """This batcher's side of every model's budget: the slots it took and has not used yet,
    those its batches hold, and the asks under way."""

    def __init__(self, shared: SharedBudget | None, *, mode: str = "auto",
                 limits: Callable[[str], Mapping[str, int]],
                 wake: Callable[[], None], clock: Callable[[], float],
                 waited: Callable[[str, float], None] = lambda model, seconds: None) -> None:
        self.shared_budget = shared
        self.mode = mode if shared is not None else "local"
        self.limits = limits
        self.wake = wake
        self.clock = clock
        self.waited = waited
        self.live = 1  # batchers holding a live lease, as the last look saw
        self._shared_until = 0.0  # auto: shared until then since others were last seen
        self.granted: dict[str, list[Slot]] = {}  # taken, for the model's next batch
        self.held: set[Slot] = set()  # in use by batches at Triton
        self._asking: dict[str, _Asking] = {}
        self._giving: set[asyncio.Task[None]] = set()

    @property
    def shared(self) -> bool:
        """Whether slots come from Redis now."""
        return self.mode == "shared" or (self.mode == "auto" and (
            self.live > 1 or self.clock() < self._shared_until))

    def saw(self, live: int, hold_s: float) -> None:
        """``live`` batchers hold a lease now. Auto: shared at once when others are seen, and
        for ``hold_s`` after they were last seen (a late heartbeat, a busy loop, is not the
        fleet gone: counting alone too soon would send batches past the budget)."""
        self.live = live
        if live > 1:
            self._shared_until = self.clock() + hold_s

    def asking(self, model: str) -> bool:
        ask = self._asking.get(model)
        return ask is not None and ask.task is not None and not ask.task.done()

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
        return slot

    def ask(self, model: str, wanted: Callable[[], bool]) -> None:
        """Ask for a slot of ``model`` until one is taken or ``wanted`` says no more."""
        if self.asking(model) or self.free(model):
            return
        ask = self._asking.setdefault(model, _Asking())
        ask.since = self.clock()
        ask.task = asyncio.get_running_loop().create_task(self._ask(model, wanted, ask),
                                                          name=f"ferry-budget-{model}")

    async def _ask(self, model: str, wanted: Callable[[], bool], ask: _Asking) -> None:
        assert self.shared_budget is not None
        while wanted() and self.shared:
            ask.bell.clear()
            try:
                slot = await self.shared_budget.take(model, self.limits(model))
            except RedisUnavailableError as exc:
                log.warning("asking for a slot of %s failed: %s", model, exc)
                slot = None
            if slot is not None:
                self.granted.setdefault(model, []).append(slot)
                self.waited(model, self.clock() - ask.since)
                self.wake()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ask.bell.wait(), ASK_EVERY_S)
        if self.shared:  # no more work for it: leave the queue, or the others wait for us
            self._spawn(self.shared_budget.give(model, (), leave=True))
        self.wake()

    def ring(self, model: bytes) -> None:
        """A slot of ``model`` freed somewhere (the budget channel): ask again now."""
        ask = self._asking.get(model.decode(errors="replace"))
        if ask is not None:
            ask.bell.set()

    def give(self, slot: Slot) -> None:
        """A batch's slot is free (its call is done at Triton)."""
        self.held.discard(slot)
        if slot.token and self.shared_budget is not None:
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
        for model, ask in self._asking.items():
            if ask.task is not None and not ask.task.done():
                ask.task.cancel()
                if self.shared_budget is not None:
                    self._spawn(self.shared_budget.give(model, (), leave=True))
        self.unused(list(self.granted))
        if self._giving:
            await asyncio.wait(list(self._giving), timeout=1.0)
