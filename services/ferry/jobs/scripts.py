"""Bulk jobs' Lua scripts: sources in ``lua/``, named arguments declared here once, results
decoded here into types; loaded by ``ferry.lua``.

Every change a runner makes is fenced by the job's lease: each script but ``move`` checks the
lease first and answers ``Fence``.
"""

from __future__ import annotations

import functools
from enum import IntEnum
from typing import Any, NamedTuple, TypeVar

from ferry import keys
from ferry.jobs.model import JobStatus
from ferry.lua import ScriptSpec


class Fence(IntEnum):
    """Whether a step fenced by a job's lease was taken."""

    HELD = 1  # the caller's token holds the lease: the step was taken
    LOST = 0  # another runner holds it, or none does: nothing was written


class Field(NamedTuple):
    """One field of a job's record to set (per item of ``set_fenced`` and ``move``)."""

    field: str
    value: str | int | float


class SetFencedKeys(NamedTuple):
    job: str
    lease: str


class SetFencedArgs(NamedTuple):
    token: str


class CommitKeys(NamedTuple):
    job: str
    done: str  # a bit per item
    flight: str
    segments: str
    lease: str


class CommitArgs(NamedTuple):
    token: str
    segment: str  # '' none


class CommitItem(NamedTuple):
    item_index: int
    count_field: str  # the record's count the item ended in


class FlyKeys(NamedTuple):
    job: str
    flight: str
    lease: str


class FlyArgs(NamedTuple):
    token: str
    cursor: int  # the next item's index
    offset: int  # its line's offset


class FlyItem(NamedTuple):
    item_index: int
    entry: str  # "<task id> <line offset>"


class ForgetKeys(NamedTuple):
    job: str
    done: str
    lease: str


class ForgetArgs(NamedTuple):
    token: str
    count_field: str  # the count every forgotten item ended in


class ForgetItem(NamedTuple):
    item_index: int


class LeaseKeys(NamedTuple):
    job: str
    lease: str


class LeaseArgs(NamedTuple):
    token: str
    ms: int


class ReleaseKeys(NamedTuple):
    lease: str


class ReleaseArgs(NamedTuple):
    token: str


class MoveKeys(NamedTuple):
    job: str


class MoveArgs(NamedTuple):
    from_states: str  # space-separated
    to_state: str
    stamp_field: str
    stamp: str


_job_script = functools.partial(ScriptSpec, "ferry.jobs")
_fenced = functools.partial(_job_script, results=(Fence, "FENCE_"))

SET_FENCED = _fenced("set_fenced", SetFencedKeys._fields, SetFencedArgs._fields,
                     item=Field._fields)
COMMIT = _fenced("commit", CommitKeys._fields, CommitArgs._fields, item=CommitItem._fields)
FLY = _fenced("fly", FlyKeys._fields, FlyArgs._fields, item=FlyItem._fields)
FORGET = _fenced("forget", ForgetKeys._fields, ForgetArgs._fields, item=ForgetItem._fields)
LEASE = _fenced("lease", LeaseKeys._fields, LeaseArgs._fields)
RELEASE = _fenced("release", ReleaseKeys._fields, ReleaseArgs._fields)
MOVE = _job_script("move", MoveKeys._fields, MoveArgs._fields, item=Field._fields)
SCRIPTS = (SET_FENCED, COMMIT, FLY, FORGET, LEASE, RELEASE, MOVE)


Names = TypeVar("Names", bound=NamedTuple)


def job_keys(names: type[Names], job_id: str) -> Names:
    """A script's KEYS, each named as the part of the job it is (``keys.job_key``)."""
    return names._make(keys.job_key(job_id, part) for part in names._fields)


def fence(reply: Any) -> Fence:
    """Whether a fenced step was taken."""
    return Fence(int(reply))


def state_before(reply: Any) -> JobStatus | None:
    """The move script's answer: the job's state before it (None: no such job)."""
    return JobStatus(reply.decode()) if reply is not None else None
