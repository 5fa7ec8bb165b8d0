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
        by replacing that head, and a cached answer is the part from ``model_version`` on (see
        ``answer_at``)."""
        body: dict[str, Any] = {"task_id": self.task_id, "created_at": self.created_at,
                                "status": self.status.value, "model": self.model}
        if self.priority != "normal":
            body["priority"] = self.priority
        if self.deadline_at is not None:
            body["deadline_at"] = self.deadline_at
        if self.finished_at is not None:
            body["finished_at"] = self.finished_at
        if self.answered_by is not None:
            body["answered_by"] = self.answered_by
        if self.model_version:
            body["model_version"] = self.model_version
        if self.output is not None:
            body["output"] = self.output
        if self.error is not None:
            body["error"] = self.error
        return body

    def body(self) -> bytes:
        """The record as the API serves it."""
        return dumps(self.to_json())


def answer_at(body: bytes) -> int:
    """Where, in a successful record's body, the answer that identical requests may reuse from
    the cache begins (1-based, for Lua): the comma before ``"model_version"`` (or ``"output"``);
    0 if it has neither."""
    at = body.find(b',"model_version":')
    if at < 0:
        at = body.find(b',"output":')
    return at + 1  # 0: none


@dataclass(frozen=True)
class StoredRecord:
    """A record as read back: its status, and the JSON the API serves as it is."""

    status: Status
    body: bytes

    def to_json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = orjson.loads(self.body)
        return parsed
