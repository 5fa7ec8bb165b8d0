"""The shared budget's Redis side: the scripts that take a slot of a model or queue for one,
offer and pull riders, give slots back and renew them (``lua/budget_*.lua``), and the slot they
deal in. ``budget.Budget`` is the batcher's side, which decides when to call them.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from ferry import keys, lua
from ferry.resp.client import Commands

PATIENCE_MS = 1000  # a waiter that has not asked for this long leaves the queue


class TakeKeys(NamedTuple):
    slots: str
    queue: str
    seen: str
    offers: str
    taken: str


class TakeArgs(NamedTuple):
    consumer: str
    token: str
    lease_ms: int
    patience_ms: int
    room: int  # riders wanted, should a slot be taken
    model: str


class TakeItem(NamedTuple):
    kind: str  # 's': a server (name: endpoint, value: its instances); 'o': an offer of this
    name: str  # batcher's (name: "stream|entry id", value: its place in the set)
    value: int | float


class PullKeys(NamedTuple):
    slots: str
    offers: str
    taken: str


class PullArgs(NamedTuple):
    consumer: str
    batch: int  # the most tasks its next batch carries
    lease_ms: int
    model: str


class PullItem(NamedTuple):
    place: float  # of one of its own boarded tasks, in order


class OfferKeys(NamedTuple):
    offers: str
    taken: str


class OfferArgs(NamedTuple):
    consumer: str
    lease_ms: int


class OfferItem(NamedTuple):
    member: str  # "stream|entry id"
    place: float  # its place in the set: high priority first, then oldest first


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
                      item=TakeItem._fields,
                      fragments=("budget_withdraw", "budget_ride", "budget_told"),
                      constants=(("BUDGET_CHANNEL", keys.BUDGET_CHANNEL),))
OFFER = lua.ScriptSpec("ferry.batcher", "budget_offer", OfferKeys._fields, OfferArgs._fields,
                       item=OfferItem._fields, fragments=("budget_told",))
PULL = lua.ScriptSpec("ferry.batcher", "budget_pull", PullKeys._fields, PullArgs._fields,
                      item=PullItem._fields, fragments=("budget_ride",),
                      constants=(("BUDGET_CHANNEL", keys.BUDGET_CHANNEL),))
GIVE = lua.ScriptSpec("ferry.batcher", "budget_give", TakeKeys._fields, GiveArgs._fields,
                      item=SlotItem._fields, fragments=("budget_withdraw",),
                      constants=(("BUDGET_CHANNEL", keys.BUDGET_CHANNEL),))
RENEW = lua.ScriptSpec("ferry.batcher", "budget_renew", RenewKeys._fields, RenewArgs._fields,
                       item=SlotItem._fields)


KeysT = TypeVar("KeysT", TakeKeys, PullKeys, OfferKeys, RenewKeys)


def _keys(model: str, shape: type[KeysT]) -> KeysT:
    """A script's KEYS: the model's budget keys its NamedTuple names."""
    return shape(*(keys.budget_key(model, part) for part in shape._fields))


def _riders(reply: Any) -> list[tuple[str, str, str]]:
    """Riders as a script answers them (``owner|stream|entry id``): (owner, stream, entry id)."""
    return [(owner, stream, entry_id) for owner, stream, entry_id in (
        _text(member).split("|", 2) for member in reply)]


class Taken(NamedTuple):
    """What an ask for a slot got: the slot (None: it waits in the queue), the offers of this
    batcher's that others took ("stream|entry id" each), and the riders its slot takes along
    (owner, stream, entry id)."""

    slot: Slot | None
    gone: list[str]
    riders: list[tuple[str, str, str]]


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        self._offer = hot.register_script(lua.source(OFFER))
        self._pull = hot.register_script(lua.source(PULL))
        self._renew = hot.register_script(lua.source(RENEW))

    async def take(self, model: str, limits: Mapping[str, int],
                   offers: Iterable[tuple[str, float]] = (), room: int = 0,
                   giving: Iterable[Slot] = ()) -> Taken:
        """A slot of ``model`` on one of ``limits``' servers (each with its instances), with up
        to ``room`` of the other waiters' offers as riders; or none: this batcher waits in the
        model's queue, offering ``offers`` (its tasks, "stream|entry id" and place). The slots
        ``giving`` are given back first (its batches are done)."""
        token = f"{self.consumer}.{secrets.token_hex(6)}"  # whose slot it is, for riders
        servers = list(limits.items())
        random.shuffle(servers)  # of those with the most room, the script takes the first
        reply: Any = await self.hot.execute(*self._take.command(
            _keys(model, TakeKeys),
            [*TakeArgs(self.consumer, token, self.lease_ms, self.patience_ms, room, model),
             *lua.items(TakeItem("s", e, n) for e, n in servers),
             *lua.items(TakeItem("o", member, place) for member, place in offers),
             *lua.items(TakeItem("g", slot.member, 0) for slot in giving)]))
        gone = [_text(member) for member in reply[2]]
        if int(reply[0]) != 1:
            return Taken(None, gone, [])
        return Taken(Slot(model, _text(reply[1]), token), gone, _riders(reply[3]))

    async def pull(self, model: str, batch: int, own: Sequence[float] = ()
                   ) -> list[tuple[str, str, str]]:
        """The other batchers' offers of ``model`` that this batcher's next batch carries, as
        riders (owner, stream, entry id): of the first ``batch`` tasks over its own boarded
        ones (their places ``own``, in order) and the offers, in the set's order, the offers.
        With ``own`` empty, the first ``batch`` offers."""
        ahead = sorted(own)[:batch]
        return _riders(await self.hot.execute(*self._pull.command(
            _keys(model, PullKeys), [*PullArgs(self.consumer, batch, self.lease_ms, model),
                                     *lua.items(PullItem(p) for p in ahead)])))

    async def offer(self, model: str, offers: Iterable[tuple[str, float]]) -> list[str]:
        """Offer tasks this batcher holds ("stream|entry id", place) to ``model``'s queue;
        the offers of its that others took since it last asked."""
        reply: Any = await self.hot.execute(*self._offer.command(
            _keys(model, OfferKeys), [*OfferArgs(self.consumer, self.lease_ms),
                                      *lua.items(OfferItem(m, p) for m, p in offers)]))
        return [_text(member) for member in reply]

    async def give(self, model: str, slots: Iterable[Slot], *, leave: bool = False) -> None:
        """Give ``model``'s slots back (telling its waiters); with ``leave``, leave its queue."""
        await self.hot.execute(*self._give.command(
            _keys(model, TakeKeys), [*GiveArgs(self.consumer, model, int(leave)),
                           *lua.items(SlotItem(s.member) for s in slots)]))

    async def renew(self, model: str, slots: Iterable[Slot]) -> int:
        """Another lease for ``model``'s slots; how many were still held."""
        members = [SlotItem(s.member) for s in slots]
        if not members:
            return 0
        return int(await self.hot.execute(*self._renew.command(
            _keys(model, RenewKeys),
            [*RenewArgs(self.lease_ms), *lua.items(members)])))
