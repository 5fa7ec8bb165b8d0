"""The rollouts' keeper: applies the guard's decisions and compares shadow answers. One runs at
a time (in the batcher that owns partition 0); every change it makes checks the rollout's
generation, so an admin's change made meanwhile wins and the guard looks again next round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from ferry.rollouts.compare import Comparison, Verdict, compare
from ferry.rollouts.guard import Decision, decide
from ferry.rollouts.latency import latency_json
from ferry.rollouts.rollout import Rollout
from ferry.rollouts.store import Pair, RolloutStore
from ferry.tasks.record import Status, StoredRecord

log = logging.getLogger(__name__)
PAIRS_PER_ROUND = 200  # shadow pairs compared per model and round
PAIR_PATIENCE_S = 600.0  # a pair whose tasks have not both ended by then is skipped
Reader = Callable[[str], Awaitable[StoredRecord | None]]
Breakers = Callable[[str, str], Awaitable[str]]  # a model version's breaker, as gateways see it


async def _closed(model: str, version: str) -> str:
    return "closed"


class RolloutKeeper:
    """One round at a time: the guard's decision for every live rollout, then the shadow pairs
    whose tasks have both ended."""

    def __init__(self, store: RolloutStore, read: Reader,
                 on_decision: Callable[[Rollout, Decision], None] = lambda r, d: None,
                 breaker: Breakers = _closed) -> None:
        self.store = store
        self.read = read
        self.on_decision = on_decision
        self.breaker = breaker

    async def round(self, now: float | None = None) -> dict[str, Rollout]:
        """One round; every rollout as the round left it."""
        now = time.time() if now is None else now
        rollouts = await self.store.all()
        for model, rollout in rollouts.items():
            if rollout.live:
                rollouts[model] = await self.guard(rollout, now)
        for model, rollout in rollouts.items():
            await self.compare_pairs(model, Comparison.from_json(rollout.compare), now)
        return rollouts

    async def guard(self, rollout: Rollout, now: float) -> Rollout:
        """Decide for one rollout, and carry the decision out (logged with its figures); the
        rollout as it stands after (as it was, if another change came first)."""
        stable = await self.store.figures(rollout.model, rollout.stable, rollout.since, now)
        candidate = await self.store.figures(rollout.model, rollout.candidate, rollout.since,
                                             now)
        decision = decide(rollout, stable, candidate, now,
                          await self.breaker(rollout.model, rollout.candidate))
        figures = {"stable": stable.to_json(), "candidate": candidate.to_json(),
                   "latency": latency_json(stable, candidate)}
        look = {"at": now, "action": decision.action, "reason": decision.reason,
                "figures": figures}
        await self.store.note_check(rollout.model, look)
        if decision.action == "hold":
            return rollout
        after = _applied(rollout, decision, now)
        entry = {"at": now, "action": decision.action, "by": "guard", "reason": decision.reason,
                 "share_from": rollout.share, "share": after.share, "stable": after.stable,
                 "candidate": rollout.candidate, "figures": figures}
        if await self.store.change(rollout, after, entry):
            log.warning("rollout of %s: %s (%s)", rollout.model, decision.action,
                        decision.reason)
            self.on_decision(after, decision)
            return after
        return rollout

    async def compare_pairs(self, model: str, how: Comparison, now: float) -> int:
        """Compare the pairs whose tasks have both ended; how many were settled."""
        settled: list[tuple[Pair, Verdict | str]] = []
        for pair, at in await self.store.pairs(model, PAIRS_PER_ROUND):
            verdict = await self._verdict(pair, how, now - at > PAIR_PATIENCE_S)
            if verdict is not None:
                settled.append((pair, verdict))
        await self.store.settle_pairs(model, settled)
        return len(settled)

    async def _verdict(self, pair: Pair, how: Comparison, overdue: bool) -> Verdict | str | None:
        """The pair's verdict, why it is skipped, or None to look again later."""
        primary, shadow = await self.read(pair.primary), await self.read(pair.shadow)
        if primary is None or shadow is None:
            return "expired" if overdue or (primary is None and shadow is None) else None
        if not (primary.status.final and shadow.status.final):
            return "unfinished" if overdue else None
        if primary.status is not Status.SUCCESS:
            return f"primary_{primary.status.value.lower()}"
        if shadow.status is not Status.SUCCESS:
            return f"shadow_{shadow.status.value.lower()}"
        return compare(primary.to_json().get("output"), shadow.to_json().get("output"), how)


def _applied(rollout: Rollout, decision: Decision, now: float) -> Rollout:
    if decision.action == "rollback":
        return rollout.rolled_back(now)
    if decision.action == "promote":
        return rollout.promoted(now)
    return rollout.changed(now, share=decision.share, since=now)
