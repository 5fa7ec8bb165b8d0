"""The batcher's part in Ferry's statistics (``ferry.oip.statistics``: what Triton's
``ModelStatistics`` answers through Ferry): every task it settles and every call to Triton it
made, tallied by (model, version) in memory and added into Redis a few times a second
(``ferry.oip.served``), never per task.

The desk stands in front of the version desk as the executor's desk: the version desk prepares
and is told of each settled batch first."""

from __future__ import annotations

from collections.abc import Sequence

from ferry.batcher.executor import Desk, Outcome
from ferry.oip.served import ServedDesk
from ferry.oip.statistics import Served
from ferry.resp.client import Commands
from ferry.tasks.record import Status

COUNTED = {Status.SUCCESS: True, Status.FAILED: False, Status.EXPIRED: False}  # ok or not


class StatisticsDesk:
    """Start, stop; the executor calls ``prepare`` and ``settled`` for every batch it ends."""

    def __init__(self, hot: Commands, versions: Desk) -> None:
        self.versions = versions
        self.served = ServedDesk(hot)

    async def start(self) -> None:
        await self.served.start()

    async def stop(self) -> None:
        """After the last batch: what is tallied is added before the process ends."""
        await self.served.stop()

    async def prepare(self, outcomes: Sequence[Outcome]) -> Sequence[Outcome]:
        return await self.versions.prepare(outcomes)

    def settled(self, outcomes: Sequence[Outcome], finished_at: float) -> None:
        self.versions.settled(outcomes, finished_at)
        tally(self.served.tally, outcomes, finished_at)


def tally(served: Served, outcomes: Sequence[Outcome], finished_at: float) -> None:
    """Each outcome's task, and each call to Triton once (its tasks share its rows and time).
    A fallback's answer counts for the model that gave it, as Triton counts it."""
    calls: set[tuple[str, str, int, float]] = set()
    for outcome in outcomes:
        task = outcome.delivery.task
        ok = COUNTED.get(outcome.status)
        if task is None or ok is None:  # a cancelled task: neither served nor failed
            continue
        model = outcome.answered_by or task.model
        version = outcome.model_version or ("" if outcome.answered_by else task.model_version)
        served.ended(model, version, ok=ok, infer_s=outcome.infer_s,
                     total_s=max(0.0, finished_at - task.enqueued_at_ms / 1000.0))
        if outcome.infer_s > 0:
            calls.add((model, version, outcome.rows, outcome.infer_s))
    for model, version, rows, seconds in calls:
        served.call(model, version, rows=rows, seconds=seconds, ended_at=finished_at)
