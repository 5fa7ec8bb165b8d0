"""A task's status record: what a client sees at ``GET /v1/result/{task_id}``.

The record is serialized once, by whoever writes it (the gateway at admission, the batcher at
completion), and stored and served as those bytes: reading a result costs no JSON work.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from ferry.codec import dumps


class Status(StrEnum):
    PENDING = "PENDING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self is not Status.PENDING


@dataclass(frozen=True)
class TaskRecord:
    """One task's status, and its output or error once it has one."""

    task_id: str
    status: Status
    model: str
    created_at: float  # Unix seconds
    model_version: str = ""
    finished_at: float | None = None
    output: Any = None  # JSON-able (orjson Fragments allowed)
    error: str | None = None
    priority: str = "normal"
    deadline_at: float | None = None  # Unix seconds after which the answer is no longer wanted
    answered_by: str | None = None  # the fallback model that answered (breaker open)

    def to_json(self) -> dict[str, Any]:
        """The public JSON form: optional fields appear only when set. ``task_id`` and
        ``created_at`` come first: a record shared by collapsed requests is rewritten for each
        by replacing that head (see ``shared_tail``)."""
        body: dict[str, Any] = {"task_id": self.task_id, "created_at": self.created_at,
                                "status": self.status.value, "model": self.model}
        if self.priority != "normal":
            body["priority"] = self.priority
        if self.deadline_at is not None:
            body["deadline_at"] = self.deadline_at
        if self.model_version:
            body["model_version"] = self.model_version
        if self.finished_at is not None:
            body["finished_at"] = self.finished_at
        if self.answered_by is not None:
            body["answered_by"] = self.answered_by
        if self.output is not None:
            body["output"] = self.output
        if self.error is not None:
            body["error"] = self.error
        return body

    def body(self) -> bytes:
        """The record as the API serves it."""
        return dumps(self.to_json())


def shared_tail(body: bytes) -> int:
    """Where, in a record's body, the part that identical requests share begins (1-based, for
    Lua): the comma before ``"status"``, after the task's own id and creation time."""
    return body.index(b',"status":') + 1


@dataclass(frozen=True)
class StoredRecord:
    """A record as read back: its status, and the JSON the API serves as it is."""

    status: Status
    body: bytes

    def to_json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = orjson.loads(self.body)
        return parsed
