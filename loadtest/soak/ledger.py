"""What the soak knows of each request, and how each one is judged at the end.

A request is *accepted* once a gateway answered 202 with a task id. Its first final record is
what a client would have acted on; the record read again after the drain is compared with it.
Judgement, per accepted task:

- **lost**: no final record was seen by the end of the drain (the record was missing, or stayed
  PENDING), or one was seen and the record read again at the end is gone or no longer final;
- **wrong**: SUCCESS with another output than the sim model's for this input, a FAILED or EXPIRED
  record without a reason, or a status no client asked for (CANCELLED);
- **duplicated**: the record read again at the end is final but differs (finished_at, output or
  status) from the first one seen: the task was answered twice. Reported, not failed on.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FINAL = frozenset({"SUCCESS", "FAILED", "EXPIRED", "CANCELLED"})
WITH_REASON = frozenset({"FAILED", "EXPIRED"})


def expected_output(data: bytes) -> dict[str, Any]:
    """The sim model's answer for ``data`` as Ferry returns it (``output``)."""
    return {"OUTPUT": {"length": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


def payload(nonce: str, index: int, size: int = 256) -> bytes:
    """A distinct input: no cache hit or collapse can answer it from another request."""
    head = f"soak-{nonce}-{index}-".encode()
    return head + b"." * max(0, size - len(head))


@dataclass
class Attempt:
    """One POST: when (from the start of the load), to which gateway, and its outcome (202, or
    the cause of a retry: ``503 not_replicated``, ``ConnectionError``...)."""

    at_s: float
    gateway: int
    outcome: str


@dataclass
class Tracked:
    index: int
    key: str  # Idempotency-Key
    data: bytes
    scheduled_s: float
    attempts: list[Attempt] = field(default_factory=list)
    task_id: str | None = None
    accepted_s: float | None = None
    first_final: dict[str, Any] | None = None
    final_seen_s: float | None = None
    last_seen: str = ""  # status (or HTTP code) of the latest read before a final one
    reread: dict[str, Any] | None = None
    reread_status: str = ""  # "200", "404", or what went wrong

    @property
    def latency_s(self) -> float | None:
        if self.final_seen_s is None:
            return None
        return self.final_seen_s - self.scheduled_s


def is_final(record: dict[str, Any] | None) -> bool:
    return record is not None and record.get("status") in FINAL


def wrong_reason(task: Tracked) -> str | None:
    """Why the first final record (or the one read at the end) is wrong, None if right."""
    first = _wrong(task.first_final, task.data)
    if first is None and is_final(task.reread):
        again = _wrong(task.reread, task.data)
        return None if again is None else f"{again} (read at the end)"
    return first


def _wrong(record: dict[str, Any] | None, data: bytes) -> str | None:
    if record is None:
        return None
    status = record.get("status")
    if status == "SUCCESS":
        return None if record.get("output") == expected_output(data) else "wrong_output"
    if status in WITH_REASON:
        return None if record.get("error") else "no_reason"
    return f"unexpected_{str(status).lower()}"


def lost_reason(task: Tracked) -> str | None:
    """Why an accepted task counts as lost, None if it does not."""
    if task.task_id is None:
        return None
    if task.first_final is None:
        return f"never_final (last seen {task.last_seen or 'nothing'})"
    if task.reread_status == "404":
        return "vanished (final, then no record)"
    if task.reread is not None and not is_final(task.reread):
        return f"reverted (final, then {task.reread.get('status')})"
    return None


def duplicated(task: Tracked) -> bool:
    """Whether the record read at the end is a different final answer than the first seen."""
    first, again = task.first_final, task.reread
    if first is None or not is_final(again):
        return False
    assert again is not None
    return any(first.get(name) != again.get(name) for name in ("status", "finished_at", "output"))


@dataclass
class Verdicts:
    accepted: int = 0
    finished: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)  # FAILED/EXPIRED errors
    lost: list[tuple[Tracked, str]] = field(default_factory=list)
    wrong: list[tuple[Tracked, str]] = field(default_factory=list)
    duplicated: list[Tracked] = field(default_factory=list)


def judge(tasks: list[Tracked]) -> Verdicts:
    verdicts = Verdicts()
    for task in tasks:
        if task.task_id is None:
            continue
        verdicts.accepted += 1
        if task.first_final is not None:
            status = str(task.first_final.get("status"))
            verdicts.finished[status] += 1
            if status in WITH_REASON:
                verdicts.reasons[_reason(task.first_final)] += 1
        lost, wrong = lost_reason(task), wrong_reason(task)
        if lost is not None:
            verdicts.lost.append((task, lost))
        if wrong is not None:
            verdicts.wrong.append((task, wrong))
        if duplicated(task):
            verdicts.duplicated.append(task)
    return verdicts


def _reason(record: dict[str, Any]) -> str:
    """A record's error, cut to its first sentence-ish part (for counting alike ones)."""
    return str(record.get("error") or "")[:80]
