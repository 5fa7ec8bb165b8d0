"""What the API answers, as typed records: a task's result, a job's record and its result
lines. Each keeps the JSON it was read from (``raw``), so a field a newer gateway adds is not
lost."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class TaskStatus(StrEnum):
    """A task's status: PENDING until it ends, then one of the four final ones."""

    PENDING = "PENDING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self is not TaskStatus.PENDING


def _float(doc: Mapping[str, Any], name: str) -> float | None:
    value = doc.get(name)
    return float(value) if isinstance(value, int | float) else None


def _str(doc: Mapping[str, Any], name: str) -> str | None:
    value = doc.get(name)
    return str(value) if value is not None else None


@dataclass(frozen=True)
class TaskResult:
    """A task's record, as ``GET /v1/result/{id}`` answers it: ``output`` (the model's answer,
    JSON) once SUCCESS, ``error`` (why) once FAILED or EXPIRED."""

    task_id: str
    status: TaskStatus
    model: str
    created_at: float
    priority: str = "normal"
    model_version: str | None = None
    deadline_at: float | None = None
    finished_at: float | None = None
    output: Any = None
    error: str | None = None
    answered_by: str | None = None
    cache: str | None = None
    collapsed_into: str | None = None
    raw: Mapping[str, Any] | None = None

    @property
    def final(self) -> bool:
        """Whether the task has ended (its record will not change)."""
        return self.status.final

    @property
    def ok(self) -> bool:
        """Whether the task ended SUCCESS."""
        return self.status is TaskStatus.SUCCESS

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TaskResult:
        """The record from the API's JSON."""
        return cls(
            task_id=str(doc["task_id"]), status=TaskStatus(doc["status"]),
            model=str(doc.get("model", "")), created_at=float(doc.get("created_at", 0.0)),
            priority=str(doc.get("priority", "normal")),
            model_version=_str(doc, "model_version"), deadline_at=_float(doc, "deadline_at"),
            finished_at=_float(doc, "finished_at"), output=doc.get("output"),
            error=_str(doc, "error"), answered_by=_str(doc, "answered_by"),
            cache=_str(doc, "cache"), collapsed_into=_str(doc, "collapsed_into"), raw=doc)


class JobStatus(StrEnum):
    """A job's state (docs/jobs.md#states)."""

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
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED,
                        JobStatus.EXPIRED)


@dataclass(frozen=True)
class RequestCounts:
    """A job's items by how they stand."""

    total: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0
    pending: int = 0

    @property
    def done(self) -> int:
        return self.total - self.pending


@dataclass(frozen=True)
class JobProgress:
    """How far a job is: the fraction done, its rate, and the estimated seconds left."""

    fraction: float = 0.0
    items_per_s: float = 0.0
    eta_s: float | None = None


@dataclass(frozen=True)
class JobRecord:
    """A job's record, as ``GET /v1/jobs/{id}`` answers it."""

    job_id: str
    status: JobStatus
    model: str
    priority: str
    counts: RequestCounts
    progress: JobProgress
    created_at: float | None = None
    expires_at: float | None = None
    attempts: int = 1
    reason: str | None = None
    note: str | None = None
    raw: Mapping[str, Any] | None = None

    @property
    def final(self) -> bool:
        """Whether the job has ended."""
        return self.status.final

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobRecord:
        """The record from the API's JSON."""
        counts = doc.get("request_counts") or {}
        progress = doc.get("progress") or {}
        return cls(
            job_id=str(doc["job_id"]), status=JobStatus(doc["status"]),
            model=str(doc.get("model", "")), priority=str(doc.get("priority", "batch")),
            counts=RequestCounts(**{k: int(v) for k, v in counts.items()
                                    if k in RequestCounts.__dataclass_fields__}),
            progress=JobProgress(fraction=_float(progress, "fraction") or 0.0,
                                 items_per_s=_float(progress, "items_per_s") or 0.0,
                                 eta_s=_float(progress, "eta_s")),
            created_at=_float(doc, "created_at"), expires_at=_float(doc, "expires_at"),
            attempts=int(doc.get("attempts", 1)), reason=_str(doc, "reason"),
            note=_str(doc, "note"), raw=doc)


@dataclass(frozen=True)
class JobList:
    """A page of a client's jobs, newest first; ``next_before`` asks for the next page."""

    jobs: list[JobRecord]
    has_more: bool
    next_before: str | None
    raw: Mapping[str, Any]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobList:
        return cls([JobRecord.from_json(job) for job in doc.get("data", [])],
                   bool(doc.get("has_more")), _str(doc, "next_before"), doc)


@dataclass(frozen=True)
class ResultLine:
    """One item's result: ``status`` succeeded, failed, cancelled or expired; ``output`` or
    ``error`` (``{"code", "message"}``); ``line`` its line in the manifest (1 the first)."""

    custom_id: str
    line: int
    status: str
    task_id: str | None = None
    model_version: str | None = None
    output: Any = None
    error: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ResultLine:
        return cls(custom_id=str(doc["custom_id"]), line=int(doc["line"]),
                   status=str(doc["status"]), task_id=_str(doc, "task_id"),
                   model_version=_str(doc, "model_version"), output=doc.get("output"),
                   error=doc.get("error"), raw=doc)
