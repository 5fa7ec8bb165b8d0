"""A task's status record: what a client sees at ``GET /v1/result/{task_id}``, and its one owner.

The record is serialized once, by whoever writes it (the gateway at admission, the batcher at
completion), and stored and served as those bytes: reading a result costs no JSON work. Every
shape a record takes is made here, including those the Lua scripts finish inside Redis (a cache
hit's, a follower's, a cancelled one's): the scripts only join bytes prepared here, at offsets
known by construction (``Encoded``), never by searching the JSON.

A body is laid out in three parts, in this key order::

    head    {"task_id":..,"created_at":..[,"collapsed_into":..][,"review"]   the task's own
    middle  ,"status":..,"model":..[,"priority"][,"deadline_at"][,"finished_at"][,"cache"]
            [,"answered_by"]                                       shared with followers
    answer  [,"model_version"][,"output"][,"error"]                what a cache hit reuses
    }
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

from ferry.codec import dumps
from ferry.keys import TASK_ID_LENGTH
from ferry.priority import Priority
from ferry.v1.task_pb2 import Task

CANCELLED_ERROR = "cancelled by the client before inference"
EXPIRED_ERROR = "deadline passed before an answer came"  # ended by the gateway at the deadline


class Status(StrEnum):
    PENDING = "PENDING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self is not Status.PENDING


class Encoded(NamedTuple):
    """A record's body and where its parts begin (0-based): ``body[:head_end]`` is the task's
    own head, ``body[head_end:]`` what followers share; ``body[answer_at:-1]`` the answer a cache
    hit reuses (``answer_at`` 0: the record has no answer)."""

    body: bytes
    head_end: int
    answer_at: int


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
    cache: str | None = None  # "hit": answered from the result cache
    collapsed_into: str | None = None  # the identical task (same owner) whose inference answered
    review: Any = None  # a cascade's review of the answer (``ferry.rollouts.cascade``)

    @classmethod
    def pending(cls, task: Task, created_at: float) -> TaskRecord:
        """A newly admitted task's record."""
        return cls(task.task_id, Status.PENDING, task.model, created_at,
                   priority=Priority.of(task.priority).label,
                   deadline_at=task.deadline_ms / 1000.0 if task.deadline_ms else None)

    @classmethod
    def final(cls, task: Task, status: Status, finished_at: float, *, output: Any = None,
              error: str | None = None, model_version: str = "",
              answered_by: str | None = None, review: Any = None) -> TaskRecord:
        """A task's final record, as the batcher that ends it writes it."""
        return cls(task.task_id, status, task.model, task.enqueued_at_ms / 1000.0,
                   model_version, finished_at, output, error,
                   Priority.of(task.priority).label,
                   task.deadline_ms / 1000.0 if task.deadline_ms else None, answered_by,
                   review=review)

    def cache_hit(self) -> TaskRecord:
        """This (pending) task's record when the cache answers it, before the answer: final at
        once, with neither priority nor deadline (nothing waited)."""
        return TaskRecord(self.task_id, Status.SUCCESS, self.model, self.created_at,
                          finished_at=self.created_at, cache="hit")

    def hit_head(self, own: Encoded) -> bytes:
        """``cache_hit()``'s body up to its answer, made of this task's encoded head (admission
        does this for every task that may hit the cache: no second record is built)."""
        hit = middle(Status.SUCCESS, self.model, finished_at=self.created_at, cache="hit")
        return own.body[:own.head_end] + b"," + orjson.dumps(hit)[1:-1]

    def head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"task_id": self.task_id, "created_at": self.created_at}
        if self.collapsed_into is not None:
            head["collapsed_into"] = self.collapsed_into
        if self.review is not None:  # its own: neither followers nor cache hits share it
            head["review"] = self.review
        return head

    def middle(self) -> dict[str, Any]:
        return middle(self.status, self.model, priority=self.priority,
                      deadline_at=self.deadline_at, finished_at=self.finished_at,
                      cache=self.cache, answered_by=self.answered_by)

    def answer(self) -> dict[str, Any]:
        answer: dict[str, Any] = {}
        if self.model_version:
            answer["model_version"] = self.model_version
        if self.output is not None:
            answer["output"] = self.output
        if self.error is not None:
            answer["error"] = self.error
        return answer

    def to_json(self) -> dict[str, Any]:
        """The public JSON form: optional fields appear only when set."""
        return self.head() | self.middle() | self.answer()

    def encode(self) -> Encoded:
        """The body, and where its parts begin (see the module's layout)."""
        head = orjson.dumps(self.head())[:-1]
        front = head + b"," + orjson.dumps(self.middle())[1:-1]
        answer = self.answer()
        if not answer:
            return Encoded(front + b"}", len(head), 0)
        reusable = bool(self.model_version) or self.output is not None  # not an error alone
        return Encoded(front + b"," + dumps(answer)[1:], len(head), len(front) if reusable else 0)

    def body(self) -> bytes:
        """The record as the API serves it."""
        return self.encode().body


def middle(status: Status, model: str, *, priority: str = "normal",
           deadline_at: float | None = None, finished_at: float | None = None,
           cache: str | None = None, answered_by: str | None = None) -> dict[str, Any]:
    """The part of a record from its status to its answer, optional fields only when set."""
    part: dict[str, Any] = {"status": status.value, "model": model}
    if priority != "normal":
        part["priority"] = priority
    if deadline_at is not None:
        part["deadline_at"] = deadline_at
    if finished_at is not None:
        part["finished_at"] = finished_at
    if cache is not None:
        part["cache"] = cache
    if answered_by is not None:
        part["answered_by"] = answered_by
    return part


def dead_letter(task: Task | None, status: Status, error: str | None,
                problem: str | None) -> str | None:
    """Why a delivery that ends so is dead-lettered: a failure, or an entry that could not be
    read (it has no record); None: it is not."""
    if task is None or status is Status.FAILED:
        return error or problem or "unreadable task"
    return None


def reusable(task: Task | None, status: Status, model_version: str,
             answered_by: str | None) -> bool:
    """Whether an answer may be cached for identical requests: a success of the task's own
    model, of the version its digest names."""
    return (task is not None and bool(task.input_digest) and status is Status.SUCCESS
            and not answered_by and model_version == task.digest_version)


def status_fragment(status: Status) -> bytes:
    """``,"status":"<status>"``: what the cancel script swaps in a pending body."""
    return b"," + dumps({"status": status.value})[1:-1]


COLLAPSED_INTO = b"," + dumps({"collapsed_into": "%s"})[1:-1]  # Lua formats the leader's id in
# A follower's own head, as ``TaskRecord.head()`` writes it: Lua formats its id and creation time
# (JSON, from its followers-list entry) in.
FOLLOWER_HEAD = dumps({"task_id": "%s"})[:-1] + b',"created_at":%s'


def cancelled_tail(finished_at: float, error: str = CANCELLED_ERROR) -> bytes:
    """What ends a pending body cancelled (or expired: ``error``) at ``finished_at``, in place
    of its closing brace."""
    return b"," + dumps({"finished_at": finished_at, "error": error})[1:]


@dataclass(frozen=True)
class StoredRecord:
    """A record as read back: its status, and the JSON the API serves as it is."""

    status: Status
    body: bytes

    def to_json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = orjson.loads(self.body)
        return parsed

    @property
    def deadline_at(self) -> float | None:
        """When its answer is due (Unix seconds); None: no deadline, or the record is final."""
        if self.status.final or b'"deadline_at"' not in self.body:  # no parse for most
            return None
        due = self.to_json().get("deadline_at")
        return float(due) if due is not None else None


class Announcement(NamedTuple):
    """One task's end, as the scripts publish it on the done channel: its record inline, or
    ``body`` None when too large to inline (whoever waits reads it)."""

    task_id: bytes
    status: Status
    body: bytes | None

    @property
    def record(self) -> StoredRecord | None:
        return None if self.body is None else StoredRecord(self.status, self.body)


def announcements(data: bytes) -> Iterator[Announcement]:
    """Each frame ``<id> <status> <n> <n bytes of body>`` of a message (n = 0: not inlined),
    as the shared Lua fragment ``announce`` writes them; ValueError for anything else."""
    pos, end = 0, len(data)
    while pos < end:
        status_end = data.index(b" ", pos + TASK_ID_LENGTH + 1)
        size_end = data.index(b" ", status_end + 1)
        size = int(data[status_end + 1:size_end])
        status = _status(data[pos + TASK_ID_LENGTH + 1:status_end])
        body = data[size_end + 1:size_end + 1 + size] if size else None
        yield Announcement(data[pos:pos + TASK_ID_LENGTH], status, body)
        pos = size_end + 1 + size


@functools.lru_cache(maxsize=16)
def _status(name: bytes) -> Status:
    return Status(name.decode())
