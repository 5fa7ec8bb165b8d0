"""A bulk job's states, counts and public record. Pure code, no I/O.

A job goes ``queued → running → finalizing → completed | failed``; a cancel takes it through
``cancelling`` to ``cancelled``, its completion window's end through ``finalizing`` to ``expired``.
(``validating`` is the upload itself: a job exists once its whole manifest has been checked.)
Every state is stamped when entered; ``failed`` always has a reason. A job whose every item
failed is ``failed``, never ``completed`` with nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class JobStatus(StrEnum):
    VALIDATING = "validating"
    QUEUED = "queued"
    RUNNING = "running"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def final(self) -> bool:
        return self in FINAL


FINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED,
                   JobStatus.EXPIRED})

# Every move a job may make, and who makes it: the upload queues it; its runner starts it and
# finalizes it (fed, cancelled or expired) and then ends it; its client cancels it while it is
# queued or running, and retries a finished job's failed items.
TRANSITIONS: dict[JobStatus, tuple[JobStatus, ...]] = {
    JobStatus.VALIDATING: (JobStatus.QUEUED,),
    JobStatus.QUEUED: (JobStatus.RUNNING, JobStatus.CANCELLING, JobStatus.FINALIZING),
    JobStatus.RUNNING: (JobStatus.CANCELLING, JobStatus.FINALIZING),
    JobStatus.CANCELLING: (JobStatus.FINALIZING,),
    JobStatus.FINALIZING: tuple(sorted(FINAL)),
    **{final: (JobStatus.QUEUED,) for final in sorted(FINAL)},
}


def sources(to: JobStatus) -> list[JobStatus]:
    """The states a job may move to ``to`` from, in the table's order."""
    return [state for state, targets in TRANSITIONS.items() if to in targets]


def moving(before: JobStatus, to: JobStatus) -> list[JobStatus]:
    """``[before]``, for a move of one known state (a ``ValueError`` if the table has no such
    move: a bug, not a request)."""
    if to not in TRANSITIONS[before]:
        raise ValueError(f"a job does not move from {before} to {to}")
    return [before]


class ItemStatus(StrEnum):
    """How one item ended, as its result line says it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


TASK_TO_ITEM = {"SUCCESS": ItemStatus.SUCCEEDED, "FAILED": ItemStatus.FAILED,
                "CANCELLED": ItemStatus.CANCELLED, "EXPIRED": ItemStatus.EXPIRED}


@dataclass(frozen=True)
class Counts:
    """``request_counts``: every item is in exactly one of succeeded, failed, cancelled, expired
    and pending."""

    total: int
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.cancelled + self.expired

    @property
    def pending(self) -> int:
        return self.total - self.done

    def to_json(self) -> dict[str, int]:
        return {"total": self.total, "succeeded": self.succeeded, "failed": self.failed,
                "cancelled": self.cancelled, "expired": self.expired, "pending": self.pending}


def end_state(counts: Counts, ending: JobStatus) -> tuple[JobStatus, str]:
    """The final state of a job whose feeding is over (``ending``: RUNNING for a job that fed
    every item, CANCELLING or EXPIRED), and the reason when it is ``failed``."""
    if ending is JobStatus.CANCELLING:
        return JobStatus.CANCELLED, ""
    if ending is JobStatus.EXPIRED:
        return JobStatus.EXPIRED, ""
    if counts.total and counts.succeeded == 0:
        return JobStatus.FAILED, (f"every one of its {counts.total} items failed; the error "
                                  "file says why, line by line")
    return JobStatus.COMPLETED, ""


@dataclass(frozen=True)
class Progress:
    """How fast a running job goes: items done since it started running, over the time since."""

    done: int
    pending: int
    running_s: float

    @property
    def per_s(self) -> float:
        return self.done / self.running_s if self.running_s > 0 and self.done else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds to finish at the measured rate (None until an item is done)."""
        rate = self.per_s
        return math.ceil(self.pending / rate) if rate > 0 else None


@dataclass(frozen=True)
class JobRecord:
    """A job as ``GET /v1/jobs/{id}`` answers it."""

    job_id: str
    status: JobStatus
    model: str
    counts: Counts
    created_at: float
    priority: str = "batch"
    client_id: str = ""
    model_version: str = ""
    expires_at: float = 0.0
    reason: str = ""
    stamps: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    attempts: int = 1
    note: str = ""  # why a job is not moving, until its next state change

    def to_json(self, now: float) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "job_id": self.job_id, "object": "job", "status": self.status.value,
            "model": self.model, "priority": self.priority,
            "request_counts": self.counts.to_json(), "created_at": self.created_at,
            "expires_at": self.expires_at,
            "status_url": f"/v1/jobs/{self.job_id}",
            "results_url": f"/v1/jobs/{self.job_id}/results"}
        if self.model_version:
            doc["model_version"] = self.model_version
        if self.client_id:
            doc["client_id"] = self.client_id
        if self.reason:
            doc["reason"] = self.reason
        if self.note:
            doc["note"] = self.note
        doc.update({f"{state}_at": at for state, at in sorted(self.stamps.items())})
        doc["progress"] = self._progress(now)
        if self.files:
            doc["files"] = dict(self.files)
        doc["attempts"] = self.attempts
        return doc

    def _progress(self, now: float) -> dict[str, Any]:
        started = self.stamps.get(JobStatus.RUNNING.value)
        ended = min((at for state, at in self.stamps.items() if JobStatus(state).final),
                    default=None)
        running_s = ((ended or now) - started) if started else 0.0
        progress = Progress(self.counts.done, self.counts.pending, max(0.0, running_s))
        eta = progress.eta_s if not self.status.final else 0
        return {"fraction": round(self.counts.done / self.counts.total, 4)
                if self.counts.total else 1.0,
                "items_per_s": round(progress.per_s, 3), "eta_s": eta}
