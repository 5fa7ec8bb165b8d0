"""A model's rollout: its stable version, a candidate beside it, the candidate's share of
traffic, and the rules its guard applies. Pure code, no I/O.

The split is sticky: a request's key (its client id, or a key it names) hashes to a bucket in
[0, 10000); the candidate answers the buckets below its share. Raising the share keeps every
key that was on the candidate there, and a new candidate reshuffles the keys (its version is
in the hash). A request with no key is split at random.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ferry.settings.declarations import (
    DEFAULT_STEPS,
    STATES,
    STICKY,
    UNDECLARED,
    RolloutRecord,
    State,
    check,
    check_steps,
    parse_declared,
    step_problems,
    undeclared_dropped,
)

# A rollout's fields and the rules a declaration obeys are the settings' (they check the
# ``rollouts`` setting when they are built, and import no feature): named here too.
__all__ = ["BUCKETS", "DEFAULT_STEPS", "STATES", "STICKY", "TRIAL", "UNDECLARED", "Pick", "Role",
           "Rollout", "State", "Sticky", "amended", "check", "declared", "parse_declared",
           "step_problems"]

BUCKETS = 10_000
# The fields that declare a trial anew.
TRIAL = ("stable", "candidate", "share")
Role = Literal["stable", "candidate", "pinned", "policy"]


@dataclass(frozen=True)
class Sticky:
    """What a request may be split by: its client id and the rollout key it names."""

    client_id: str = ""
    rollout_key: str = ""

    def key(self, sticky: str) -> str:
        """The key for a rollout's ``sticky``: ``client`` the rollout key, else the client id;
        ``key`` the rollout key only; ``none`` none ('' : the request is split at random)."""
        if sticky == "client":
            return self.rollout_key or self.client_id
        return self.rollout_key if sticky == "key" else ""


@dataclass(frozen=True)
class Pick:
    """The version a request goes to ('': Triton's version policy picks), and why."""

    version: str
    role: Role


@dataclass(frozen=True)
class Rollout(RolloutRecord):
    """One model's versions as Ferry serves them: its record (``RolloutRecord``), and how a
    request is split, shadowed and stepped on."""

    @property
    def live(self) -> bool:
        """Whether a candidate is being tried (the guard watches it)."""
        return self.state == "canary" and bool(self.candidate)

    def pick(self, key: str, rand: float | None = None) -> Pick:
        """The version for a request whose sticky key is ``key`` ('' : none, split at random)."""
        if not self.live or self.share <= 0:
            return Pick(self.stable, "stable") if self.stable else Pick("", "policy")
        if key and self.sticky != "none":
            digest = hashlib.sha256(f"{self.model}\0{self.candidate}\0{key}".encode()).digest()
            bucket = int.from_bytes(digest[:8], "big") % BUCKETS
        else:
            bucket = int((random.random() if rand is None else rand) * BUCKETS)
        if bucket < round(self.share * BUCKETS / 100):
            return Pick(self.candidate, "candidate")
        return Pick(self.stable, "stable") if self.stable else Pick("", "policy")

    def shadowed_version(self, version: str, rand: float) -> bool:
        """Whether a request sent to ``version`` is also sent to the candidate (a share of the
        stable's requests, ``rand`` uniform in [0, 1))."""
        return (self.state == "canary" and bool(self.candidate) and self.shadow > 0
                and version == self.stable and rand * 100 < self.shadow)

    def next_share(self) -> float:
        """The guard's next step above the current share (100: promotion)."""
        return next((s for s in self.steps if s > self.share), 100.0)

    def changed(self, now: float, **fields: Any) -> Rollout:
        """This rollout with ``fields`` set, one generation on."""
        return dataclasses.replace(self, **fields, generation=self.generation + 1,
                                   updated_at=now)

    def promoted(self, now: float) -> Rollout:
        return self.changed(now, stable=self.candidate, candidate="", share=0.0,
                            state="promoted", since=now, previous=self.stable)

    def rolled_back(self, now: float) -> Rollout:
        return self.changed(now, share=0.0, state="rolled_back", since=now)


def declared(model: str, doc: Mapping[str, Any], now: float) -> Rollout:
    """A rollout as settings or the admin API declare it (a 400 naming what is wrong): a
    candidate makes it a canary."""
    rollout = _declared(model, doc, now)
    if "steps" in doc:  # a stored rollout's steps are not judged again: only those sent
        check_steps(rollout)
    return rollout


def amended(before: Rollout | None, doc: Mapping[str, Any], now: float, model: str) -> Rollout:
    """``before`` with the fields ``doc`` sends, the others kept (no rollout yet: the
    defaults). Sending ``stable``, ``candidate`` or ``share`` declares the trial anew (a
    candidate makes it a canary, the share held from now); otherwise the trial goes on as it
    was: its state, since when its share holds, its previous stable version."""
    if before is None:
        return declared(model, doc, now)
    kept = undeclared_dropped(before.to_json())
    rollout = _declared(model, {**kept, **doc}, now)
    if "steps" in doc:
        check_steps(rollout)
    if any(name in doc for name in TRIAL):
        return rollout
    return dataclasses.replace(rollout, state=before.state, since=before.since,
                               previous=before.previous)


def _declared(model: str, doc: Mapping[str, Any], now: float) -> Rollout:
    rollout = Rollout.from_json(undeclared_dropped(doc), model)
    state: State = "canary" if rollout.candidate else "stable"
    return dataclasses.replace(rollout, state=state, since=now, updated_at=now)
