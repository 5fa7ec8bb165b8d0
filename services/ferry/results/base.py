"""A task's status record, and what a result store must do with it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol


class Status(StrEnum):
    PENDING = "PENDING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"

    @property
    def final(self) -> bool:
        return self is not Status.PENDING


@dataclass(frozen=True)
class ResultRecord:
    """What a client sees at ``GET /v1/result/{task_id}``."""

    task_id: str
    status: Status
    model: str
    created_at: float  # Unix seconds
    model_version: str = ""
    finished_at: float | None = None
    output: Any = None  # JSON-able
    error: str | None = None

    def to_fields(self) -> dict[str, str]:
        """Flat string fields for a Redis hash."""
        fields = {"status": self.status.value, "model": self.model,
                  "model_version": self.model_version, "created_at": repr(self.created_at)}
        if self.finished_at is not None:
            fields["finished_at"] = repr(self.finished_at)
        if self.output is not None:
            fields["output"] = json.dumps(self.output, separators=(",", ":"))
        if self.error is not None:
            fields["error"] = self.error
        return fields

    @classmethod
    def from_fields(cls, task_id: str, fields: Mapping[str, str]) -> ResultRecord:
        finished = fields.get("finished_at")
        output = fields.get("output")
        return cls(
            task_id=task_id,
            status=Status(fields["status"]),
            model=fields.get("model", ""),
            model_version=fields.get("model_version", ""),
            created_at=float(fields.get("created_at", "0")),
            finished_at=float(finished) if finished else None,
            output=json.loads(output) if output is not None else None,
            error=fields.get("error"),
        )

    def to_json(self) -> dict[str, Any]:
        """The public JSON form: optional fields appear only when set."""
        body: dict[str, Any] = {"task_id": self.task_id, "status": self.status.value,
                                "model": self.model, "created_at": self.created_at}
        if self.model_version:
            body["model_version"] = self.model_version
        if self.finished_at is not None:
            body["finished_at"] = self.finished_at
        if self.output is not None:
            body["output"] = self.output
        if self.error is not None:
            body["error"] = self.error
        return body


class ResultStore(Protocol):
    """Reads and writes task records; ``wait`` returns when a record becomes final."""

    async def get(self, task_id: str) -> ResultRecord | None: ...

    async def complete(self, records: Sequence[ResultRecord],
                       dead_letters: Mapping[str, dict[str, bytes | str]] | None = None
                       ) -> list[bool]: ...

    async def wait(self, task_id: str, timeout_s: float) -> ResultRecord | None: ...
