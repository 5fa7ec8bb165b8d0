"""The task store's Lua scripts: sources in ``lua/``, named arguments declared here once, results
decoded here into types; loaded by ``ferry.lua`` (the prologue, the fragments ``common`` and
``unqueue``, the constants written in as literals).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NamedTuple

from ferry import keys
from ferry.lua import ScriptSpec
from ferry.tasks.base import Cancellation, CancelOutcome
from ferry.tasks.record import Status, StoredRecord
from ferry.usage import ledger


class AdmitVerdict(IntEnum):
    """How the admission script ended: what its second value is."""

    QUEUED = 1  # the stream entry's id
    HIT = 2  # the final record, answered from the cache
    COLLAPSED = 3  # the id of the identical task it follows
    BACKLOG_FULL = 0  # the partition's backlog
    TOO_SLOW = -1  # the predicted wait, seconds
    OWNER_FULL = -2  # the owner's unfinished tasks in the partition


class AdmitKeys(NamedTuple):
    task_key: str
    stream: str  # the task's priority's stream of its partition
    backlog: str
    normal_stream: str  # where a doorbell rings
    bell_key: str
    digest_key: str
    webhooks: str
    fair_queue: str  # where it waits while its model's backlog is contended
    fair_state: str  # that queue's virtual clock and flows


class AdmitArgs(NamedTuple):
    """What every admission of one call shares."""

    pending_ttl: int
    bell_ms: int
    result_ttl: int
    group: str  # the batchers' consumer group (what they have read of the stream)


class AdmitItem(NamedTuple):
    """One admission's part of the call's ARGV (its KEYS: ``AdmitKeys``)."""

    task_id: str
    pending_body: bytes
    created: bytes  # its creation time as in its head ('' unless it may collapse)
    envelope: bytes
    backlog_prefix: str  # "<model>|"
    priority: int
    limit: int  # the partition's backlog limit (0: none)
    rate: bytes  # tasks/s per partition (0: unknown)
    fixed_wait: bytes  # seconds besides the backlog ahead
    timeout: bytes  # the client's, seconds (0: none)
    lookup: int  # 1: a cached answer may answer it
    collapse: int  # 1: it may follow an identical task in flight
    hit_head: bytes  # its record if the cache answers it, up to the answer ('' no lookup)
    callback: str  # '' none
    owner: str  # the authenticated client ('' none)
    owner_field: str  # the owner's backlog field ('' not counted)
    owner_limit: int  # that field's limit in the partition (0: none)
    task_prefix: str
    followers_prefix: str
    fair_after: int  # its model's backlog here from which tasks wait in fair order (0: never)
    flow: str  # its fair flow: its client's tasks of its model
    weight: bytes  # its client's weight (> 0)
    cost: int  # what it costs its flow: its rows


class CompleteKeys(NamedTuple):
    """One stream's part of the call's KEYS (its tasks' keys come after every stream's)."""

    stream: str
    dead_letters: str
    backlog: str
    webhooks: str


class CompleteArgs(NamedTuple):
    group: str
    result_ttl: int
    dead_letter_maxlen: int
    inline_limit: int
    failed_at: str
    cache_ttl: int  # 0: no cache
    collapsed_into: bytes  # the fragment a follower of the same owner gets (%s: the leader)
    follower_head: bytes  # a follower's head, from its list entry (%s: its id, its created)
    ledger_ttl: int
    shard: str  # '' PUBLISH the announcements; on a Redis Cluster, the partition's hash tag:
    # SPUBLISH them in its slot (keys.done_shard_channel)
    streams: int  # how many streams' deliveries the call settles


class CompleteStream(NamedTuple):
    """One stream's part of the call's ARGV, after the named ones (its items come after every
    stream's)."""

    task_prefix: str
    followers_prefix: str
    cache_prefix: str
    ledger: str  # the partition's usage ledger for this hour (keys.ledger_key: the same slot)
    entries: int  # its deliveries


class CompleteItem(NamedTuple):
    """One delivery's part of the completion script's ARGV."""

    entry_id: str
    task_id: str  # '' for an unreadable entry
    status: str
    body: bytes
    head_end: int  # the body's own head: what follows is shared with followers
    answer_from: int  # 1-based start of a reusable answer (0: not reusable)
    dead_letter: str  # the reason ('' none)
    envelope: bytes  # only for a dead letter
    deliveries: int
    backlog_field: str  # "<model>|<priority>"
    digest: str  # '' none
    callback: str  # '' none
    ledger_field: str  # "<client>\t<model>\t", what its ledger fields start with ('' none)
    rows: int  # the rows Triton inferred for it (0: it reached no call that answered)
    gpu_us: int  # its share of that call's time, microseconds


class CancelKeys(NamedTuple):
    task_key: str
    backlog: str
    followers: str  # the task's own followers list
    webhooks: str


class CancelArgs(NamedTuple):
    task_id: str
    client_id: str  # '' any: another client's task is as unknown as none
    group: str
    result_ttl: int
    cancel_channel: str
    pending_status: bytes
    cancelled_status: bytes
    cancelled_tail: bytes
    followers_prefix: str
    shard: str  # as CompleteArgs.shard


class ExpireKeys(NamedTuple):
    task_key: str
    backlog: str
    followers: str  # the task's own followers list
    webhooks: str


class ExpireArgs(NamedTuple):
    task_id: str
    group: str
    result_ttl: int
    pending_status: bytes
    expired_status: bytes
    expired_tail: bytes
    followers_prefix: str
    shard: str  # as CompleteArgs.shard


class WithdrawKeys(NamedTuple):
    task_key: str
    backlog: str
    followers: str  # the task's own followers list


class WithdrawArgs(NamedTuple):
    task_id: str
    group: str
    followers_prefix: str
    hit: int  # 1: the admission was answered from the cache


class Withdrawal(IntEnum):
    """What the withdraw script did with an admission replicas did not confirm."""

    GONE = 1  # deleted (or never on this server): the client is told to try again
    KEPT = 0  # a batcher has it, others follow it, or it ended: it stands


class HealKeys(NamedTuple):
    backlog: str  # then each of the partition's streams


class ReviewKeys(NamedTuple):
    task_key: str  # the reviewed task's hash
    webhooks: str  # its partition's webhook stream


class ReviewArgs(NamedTuple):
    task_id: str  # the reviewed task's id
    marker: bytes  # the review's pending entry, as the record holds it
    review: bytes  # what takes its place
    url: str  # the reviewed task's callback URL ('' : none)


# What every task script shares with Python: statuses, stream field names, the webhook cap.
TASK_CONSTANTS: tuple[tuple[str, str | int], ...] = (
    *((s.name, s.value) for s in Status), ("TASK_FIELD", keys.TASK_FIELD),
    ("BELL_FIELD", keys.BELL_FIELD), ("WEBHOOK_MAXLEN", keys.WEBHOOK_MAXLEN),
    ("FAIR_FIELD", keys.FAIR_FIELD), ("FAIR_STATE_TTL_MS", keys.FAIR_STATE_TTL_MS),
    ("DONE_CHANNEL_PREFIX", keys.DONE_CHANNEL_PREFIX),
    ("ANNOUNCE_TAG_LENGTH", keys.ANNOUNCE_TAG_LENGTH))
_task_script = functools.partial(ScriptSpec, "ferry.tasks", constants=TASK_CONSTANTS)

ADMIT = _task_script("admit", (), AdmitArgs._fields, each=(AdmitKeys._fields, AdmitItem._fields),
                     results=(AdmitVerdict, "VERDICT_"),
                     fragments=("common", "ferry.queue:entries"))
COMPLETE = _task_script("complete", (), CompleteArgs._fields,
                        each=(CompleteKeys._fields, CompleteStream._fields),
                        item=CompleteItem._fields, fragments=("common", "ferry.queue:entries"),
                        constants=(*TASK_CONSTANTS, *(
                            (f"LEDGER_{m.upper()}", m) for m in ledger.MEASURES)))
# cancel's, expire's and withdraw's
UNQUEUE_FRAGMENTS = ("common", "fair_flow", "ferry.queue:entries", "unqueue")
CANCEL = _task_script("cancel", CancelKeys._fields, CancelArgs._fields,
                      results=(CancelOutcome, "OUTCOME_"), fragments=UNQUEUE_FRAGMENTS)
EXPIRE = _task_script("expire", ExpireKeys._fields, ExpireArgs._fields,
                      fragments=UNQUEUE_FRAGMENTS)
WITHDRAW = _task_script("withdraw", WithdrawKeys._fields, WithdrawArgs._fields,
                        results=(Withdrawal, "WITHDRAW_"), fragments=UNQUEUE_FRAGMENTS)
HEAL = _task_script("heal", HealKeys._fields, more_keys="FIRST_STREAM")
REVIEW = _task_script("review", ReviewKeys._fields, ReviewArgs._fields, fragments=("common",))
SCRIPTS = (ADMIT, COMPLETE, CANCEL, EXPIRE, HEAL, REVIEW, WITHDRAW)


_VERDICTS: dict[int, AdmitVerdict] = {int(verdict): verdict for verdict in AdmitVerdict}


def admit_verdict(reply: Sequence[Any]) -> tuple[AdmitVerdict, Any]:
    """The admission script's verdict, and its value (see ``AdmitVerdict``)."""
    return _VERDICTS[reply[0]], reply[1]


def cancellation(reply: Sequence[Any]) -> Cancellation:
    """What the cancel script found (see ``CancelOutcome``)."""
    outcome = CancelOutcome(int(reply[0]))
    if outcome is CancelOutcome.FINAL:
        return Cancellation(outcome, StoredRecord(Status(reply[1].decode()), reply[2]))
    if outcome is CancelOutcome.CANCELLED:
        return Cancellation(outcome, StoredRecord(Status.CANCELLED, reply[1]))
    return Cancellation(outcome, None)


def expiry(reply: Sequence[Any]) -> StoredRecord | None:
    """The record the expire script left (final), or None: unknown, or others follow it."""
    if not reply:
        return None
    return StoredRecord(Status(reply[0].decode()), reply[1])
