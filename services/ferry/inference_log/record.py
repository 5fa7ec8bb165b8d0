"""Which finished tasks are logged, and what a task's record holds (pure: no I/O).

A task is logged when a hash of its id falls below its model's rate, so the decision is the
same wherever and however often the task is completed (a redelivered task is logged or not as
it was the first time). Its record is one JSON object: the task, its times, its batch, the
request and the answer (or the error). A payload whose JSON is longer than the cap is cut to
the cap and marked; a JSON object's field named in ``log_redact`` has its value replaced,
wherever it is (in the request's payload or tensors, in the answer), before anything is cut.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from ferry import tensors
from ferry.codec import bytes_to_json
from ferry.oip.answer import tensor_json
from ferry.tasks.base import Completion
from ferry.v1.task_pb2 import Task

REDACTED = "[redacted]"
HASH_SPACE = float(1 << 64)


def sampled(task_id: str, rate: float) -> bool:
    """Whether the task is in its model's logged share: the first 64 bits of a BLAKE2b hash of
    its id, as a fraction of their range, below ``rate`` (uniform over task ids)."""
    if rate >= 1:
        return True
    digest = hashlib.blake2b(task_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * HASH_SPACE


@dataclass(frozen=True)
class Shaping:
    """How payloads are written into a record: the longest one kept whole (its JSON, bytes)
    and the fields whose values are redacted."""

    max_payload_bytes: int = 65_536
    redacted: frozenset[str] = frozenset()

    def payload(self, value: Any) -> tuple[Any, bool]:
        """``value`` as the record holds it (redacted, then cut if too long; as JSON
        already serialized), and whether it was cut."""
        if self.redacted and value is not None:
            value = redact(orjson.loads(orjson.dumps(value)), self.redacted)
        text = orjson.dumps(value)
        if len(text) <= self.max_payload_bytes:
            return orjson.Fragment(text), False
        return cut(text, self.max_payload_bytes), True


def redact(value: Any, fields: frozenset[str]) -> Any:
    """``value`` (parsed JSON) with the value of every object field named in ``fields``
    replaced by ``REDACTED``, at any depth."""
    if isinstance(value, dict):
        return {key: REDACTED if key in fields else redact(item, fields)
                for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item, fields) for item in value]
    return value


def cut(text: bytes, limit: int) -> dict[str, Any]:
    """The marker that stands for a payload whose JSON is over ``limit`` bytes: its size and
    as much of its beginning, as text, as takes at most ``limit`` bytes written as a JSON
    string (quotes and control characters are escaped; a character cut in two is left
    out)."""
    keep = limit
    while True:
        head = text[:keep].decode("utf-8", "ignore")
        written = len(orjson.dumps(head))
        if written <= limit:
            return {"cut": True, "bytes": len(text), "head": head}
        keep = keep * limit // written  # smaller, in proportion to what escaping added


@dataclass(frozen=True)
class Batch:
    """The batch a completion came in: an id shared by its records, and its size in tasks."""

    id: str
    tasks: int


def request_of(task: Task) -> dict[str, Any]:
    """What the model was asked: a one-BYTES task's payload (JSON as it is, UTF-8 as text,
    anything else as ``{"base64": ...}``) and content type; a tensor task's inputs in the Open
    Inference Protocol's JSON form, as ``GET /v1/result`` writes a tensor task's outputs (a
    BYTES element as its text, one that is not UTF-8 or a NaN as ``{"b64": ...}``: a request
    logged can be sent again as it was), and the outputs it asked for."""
    if not task.inputs:
        return {"content_type": task.content_type, "payload": bytes_to_json(task.payload)}
    inputs = [tensor_json(tensors.Tensor(t.name, t.datatype, tuple(t.shape), t.contents))
              for t in task.inputs]
    return {"inputs": inputs, "outputs": list(task.outputs)}


def record_of(completion: Completion, batch: Batch, shaping: Shaping,
              logged_at: float) -> bytes:
    """A logged task's record, as JSON (``completion`` has a task and a final record)."""
    task, final = completion.delivery.task, completion.record
    assert task is not None and final is not None, "an unreadable entry is never logged"
    request, request_cut = shaping.payload(request_of(task))
    response, response_cut = shaping.payload(final.output)
    record: dict[str, Any] = {
        "id": task.task_id, "model": task.model,
        "version": final.model_version or task.model_version or None,  # none: no call
        "client": task.client_id,
        "status": final.status.value, "priority": final.priority,
        "created_at": final.created_at, "finished_at": final.finished_at,
        "deadline_at": final.deadline_at,
        "batch": {"id": batch.id, "tasks": batch.tasks, "rows": completion.rows,
                  "gpu_us": completion.gpu_us},
        "deliveries": completion.delivery.deliveries,
        "request": request, "response": response, "error": final.error,
        "cut": [name for name, was in (("request", request_cut), ("response", response_cut))
                if was],
        "logged_at": logged_at}
    return orjson.dumps(record | _lineage(task, final.answered_by))


def _lineage(task: Task, answered_by: str | None) -> dict[str, str]:
    """Where the task came from, when it is not a client's own request: a fallback model's
    answer, a shadow copy, a cascade's review; and the OIP request's own id."""
    found = {"answered_by": answered_by or "", "shadow_of": task.shadow_of,
             "review_of": task.review_of, "request_id": task.request_id}
    return {key: value for key, value in found.items() if value}
