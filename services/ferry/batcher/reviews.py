"""The two-tier cascade in the batcher (``ferry.rollouts.cascade``): a first answer that its
model's cascade wants reviewed gets a review task, admitted before the answer is written, at
batch priority (behind every interactive request); the answer's record says so
(``"review": {"status": "PENDING", "task_id": ...}``). When the review ends, however it ends,
its end takes that entry's place, and the reviewed task's webhook is sent again.

A review that cannot be admitted (its model's backlog is full, Redis refused) is written as
``SKIPPED`` with the reason, never left pending. A first task that runs again (its batcher died
before its answer was written) gets a review of its own; the earlier review's end then finds no
entry to replace and is only in its own record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from ferry.codec import dumps
from ferry.errors import ClientError, DependencyUnavailableError, RedisUnavailableError
from ferry.rollouts.cascade import Cascade, pending_review, wants_review
from ferry.tasks.admission import Admitter, FixedLimits
from ferry.tasks.base import NO_OWNER, NOT_SHARED, Admission, Admitted, Owner, Sharing
from ferry.tasks.envelope import review_of
from ferry.tasks.record import Status, TaskRecord
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)
FINISH_TRIES = 5
NOT_ADMITTED = (ClientError, DependencyUnavailableError)


class ReviewStore(Protocol):
    """What the cascade needs of the task records: admission and the review's write."""

    async def admit(self, task: Task, pending: TaskRecord, admission: Admission = ...,
                    sharing: Sharing = NOT_SHARED, owner: Owner = NO_OWNER) -> Admitted: ...

    async def write_review(self, task_id: str, marker: bytes, review: bytes,
                           url: str) -> bool: ...


class Ended(Protocol):
    """What the cascade reads of an outcome (``executor.Outcome``)."""

    @property
    def status(self) -> Status: ...

    @property
    def output(self) -> Any: ...

    @property
    def error(self) -> str | None: ...

    @property
    def model_version(self) -> str: ...


def review_end(task: Task, ended: Ended, finished_at: float) -> dict[str, Any]:
    """What a review's end writes into the reviewed record."""
    end: dict[str, Any] = {"status": ended.status.value, "task_id": task.task_id,
                           "model": task.model}
    version = ended.model_version or task.model_version
    if version:
        end["model_version"] = version
    if ended.output is not None:
        end["output"] = ended.output
    if ended.error:
        end["error"] = ended.error
    end["finished_at"] = finished_at
    return end


class Reviews:
    """Admits the reviews a batch's answers want, and writes reviews' ends."""

    def __init__(self, cascades: Mapping[str, Cascade], store: ReviewStore, *,
                 max_backlog: int, partitions: int) -> None:
        self.cascades = cascades
        self.store = store
        # Reviews come in through the one way in, under a backlog bound of their own.
        self.admit = Admitter(store, FixedLimits(Admission(limit=max_backlog,
                                                           partitions=partitions)))
        self._finishing: set[asyncio.Task[None]] = set()

    def wanted(self, task: Task | None, status: Status, output: Any) -> Cascade | None:
        """The cascade that wants this answer reviewed, if any."""
        if task is None or status is not Status.SUCCESS or task.review_of or task.shadow_of:
            return None
        cascade = self.cascades.get(task.model)
        if cascade is None or not wants_review(cascade, _plain(output)):
            return None
        return cascade

    async def begin(self, task: Task, cascade: Cascade) -> dict[str, Any]:
        """Admit the review of ``task``; the entry its record is to hold."""
        envelope = review_of(task, cascade.review_model, cascade.review_version)
        review = envelope.task
        try:
            await self.admit(envelope)
        except NOT_ADMITTED as exc:
            log.warning("review of task %s not admitted: %s", task.task_id, exc)
            return {"status": "SKIPPED", "model": cascade.review_model,
                    "error": f"the review could not be queued: {exc}"}
        return pending_review(review.task_id, review.model, review.model_version)

    def finish(self, task: Task, ended: Ended) -> None:
        """Write a review's end into the reviewed task's record, in the background."""
        job = asyncio.create_task(self._finish(task, ended, time.time()),
                                  name=f"ferry-review-{task.task_id}")
        self._finishing.add(job)
        job.add_done_callback(self._finishing.discard)

    async def _finish(self, task: Task, ended: Ended, finished_at: float) -> None:
        marker = orjson.dumps(pending_review(task.task_id, task.model, task.model_version))
        review = dumps(review_end(task, ended, finished_at))
        for attempt in range(1, FINISH_TRIES + 1):
            try:
                written = await self.store.write_review(task.review_of, b'"review":' + marker,
                                                        b'"review":' + review,
                                                        task.review_webhook)
            except RedisUnavailableError as exc:
                log.warning("review %s: writing its end failed (try %d): %s", task.task_id,
                            attempt, exc)
                await asyncio.sleep(0.2 * attempt)
                continue
            if not written:
                log.info("review %s: task %s no longer holds it (expired, or ran again)",
                         task.task_id, task.review_of)
            return

    async def stop(self, timeout_s: float = 2.0) -> None:
        if self._finishing:
            await asyncio.wait(self._finishing, timeout=timeout_s)


def _plain(output: Any) -> Any:
    """An answer as plain JSON values (its embedded JSON fragments parsed)."""
    return orjson.loads(dumps(output)) if output is not None else None


def with_review(outcome: Any, review: dict[str, Any]) -> Any:
    """The outcome (a dataclass) with its review entry."""
    return dataclasses.replace(outcome, review=review)
