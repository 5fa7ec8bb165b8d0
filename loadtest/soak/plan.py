"""What a soak run will do, decided before it starts from its seed: the faults and their times.

Every kind of fault is a (target, action) pair. The kinds are dealt like cards: a shuffled deck
holds each kind once, and a new deck is shuffled when one runs out, so any run with at least
``len(KINDS)`` faults injects every kind. Two faults in a row never hit the same target, so one
component has time to come back before it is hit again. Times are stratified: the run is cut
into slots of ``every_s`` and each slot gets one fault at a random moment inside it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum


class Target(StrEnum):
    GATEWAY = "gateway"
    BATCHER = "batcher"
    TRITON = "triton"
    REDIS = "redis"  # the Redis master, whichever node the sentinels name


class Action(StrEnum):
    KILL = "kill"  # SIGKILL: no shutdown at all
    TERM = "term"  # SIGTERM: the process's own graceful stop
    STOP = "stop"  # SIGSTOP, then SIGCONT a few seconds later: a hung process


@dataclass(frozen=True, order=True)
class Kind:
    target: Target
    action: Action

    @property
    def name(self) -> str:
        return f"{self.action.value}-{self.target.value}"

    @classmethod
    def parse(cls, name: str) -> Kind:
        """``kill-gateway`` (action-target) as a Kind; ValueError if it is none."""
        action, _, target = name.strip().partition("-")
        return cls(Target(target), Action(action))


KINDS: tuple[Kind, ...] = tuple(Kind(t, a) for t in Target for a in Action)


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # from the start of the load
    kind: Kind
    pause_s: float  # how long a stopped process stays stopped (STOP only)


def deal(rng: random.Random, count: int, kinds: tuple[Kind, ...] = KINDS) -> list[Kind]:
    """``count`` kinds from shuffled decks of ``kinds``, no target twice in a row (when the
    kinds name more than one target)."""
    dealt: list[Kind] = []
    deck: list[Kind] = []
    while len(dealt) < count:
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        previous = dealt[-1].target if dealt else None
        pick = _next_card(deck, previous)
        deck.remove(pick)
        dealt.append(pick)
    return dealt


def _next_card(deck: list[Kind], previous: Target | None) -> Kind:
    """The first card (the deck is shuffled) of another target than ``previous`` among the
    targets with the most cards left: taking those first never leaves a deck's last cards all
    of one target."""
    left = Counter(k.target for k in deck)
    others = [k for k in deck if k.target is not previous] or deck
    most = max(left[k.target] for k in others)
    return next(k for k in others if left[k.target] == most)


def fault_plan(seed: int, duration_s: float, every_s: float, *, kinds: tuple[Kind, ...] = KINDS,
               start_s: float = 3.0, end_margin_s: float = 3.0,
               pause_s: tuple[float, float] = (2.0, 4.0)) -> list[PlannedFault]:
    """One fault in each ``every_s`` slot between ``start_s`` and ``duration_s -
    end_margin_s``, at a seeded moment in the slot's middle, of a kind dealt from the decks."""
    if every_s <= 0 or not kinds:
        return []
    rng = random.Random(seed)
    slots = max(0, int((duration_s - start_s - end_margin_s) / every_s + 1e-9))
    plan = []
    for index, kind in enumerate(deal(rng, slots, kinds)):
        at = start_s + (index + rng.uniform(0.2, 0.8)) * every_s
        plan.append(PlannedFault(round(at, 3), kind, round(rng.uniform(*pause_s), 3)))
    return plan


def backoff_s(attempt: int, base_s: float = 0.1, cap_s: float = 2.0) -> float:
    """The wait before retry ``attempt`` (1 for the first retry): doubling, capped."""
    return float(min(cap_s, base_s * 2 ** max(0, attempt - 1)))
