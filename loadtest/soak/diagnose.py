"""What Redis holds of a lost task, node by node: how a task was lost is the finding, not the
count. Read straight from every node (the master and the replicas), so a record that one has and
another lacks shows where replication stopped."""

from __future__ import annotations

from typing import Any

import redis

from ferry import keys
from ferry.stack.ports import LOOPBACK
from ferry.stack.redis_ha import SentinelGroup
from ferry.tasks import idempotency
from loadtest.soak.faults import FaultEvent
from loadtest.soak.ledger import Tracked

MAX_DIAGNOSED = 20
DEAD_LETTERS_READ = 10_000
FIELD_CHARS = 300
NEAR_BEFORE_S, NEAR_AFTER_S = 5.0, 15.0


def _text(value: Any) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text[:FIELD_CHARS]


def node_state(port: int, task: Tracked, partitions: int) -> dict[str, Any]:
    """The task's record, its stream entry's pending state, its dead letter and its
    Idempotency-Key as one node has them."""
    assert task.task_id is not None
    partition = keys.partition_of(task.task_id, partitions)
    client = redis.Redis(host=LOOPBACK, port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        raw: Any = client.hgetall(keys.task_key(task.task_id, partition))
        record = {_text(k): _text(v) for k, v in raw.items()}
        state: dict[str, Any] = {"role": _text(client.role()[0]), "record": record,
                                 "idempotency_key": _text(client.get(idempotency.redis_key(
                                     "", task.key)) or b"")}
        if record.get("stream") and record.get("entry"):
            state["pending"] = _text(client.xpending_range(
                record["stream"], keys.CONSUMER_GROUP, record["entry"], record["entry"], 1))
        letters: Any = client.xrange(keys.dead_letter_stream(partition),
                                     count=DEAD_LETTERS_READ)
        state["dead_letter"] = any(fields.get(b"task_id") == task.task_id.encode()
                                   for _, fields in letters)
        return state
    except redis.RedisError as exc:
        return {"error": _text(exc)}
    finally:
        client.close()


def faults_near(task: Tracked, events: list[FaultEvent]) -> list[dict[str, Any]]:
    """The faults that were under way around the task's life (from its submission)."""
    start = task.scheduled_s - NEAR_BEFORE_S
    end = (task.final_seen_s or task.accepted_s or task.scheduled_s) + NEAR_AFTER_S
    return [{"kind": e.kind, "at_s": e.at_s, "ended_s": e.ended_s, "name": e.name,
             "details": e.details} for e in events
            if e.at_s is not None and e.at_s <= end and (e.ended_s or e.at_s) >= start]


def sample_of(lost: list[tuple[Tracked, str]]) -> list[tuple[Tracked, str]]:
    """Up to MAX_DIAGNOSED lost tasks, taken in turn from each kind of loss (never final,
    vanished, reverted) and in time order within a kind."""
    kinds: dict[str, list[tuple[Tracked, str]]] = {}
    for item in lost:
        kinds.setdefault(item[1].split(" (")[0], []).append(item)
    picked: list[tuple[Tracked, str]] = []
    while len(picked) < min(MAX_DIAGNOSED, len(lost)):
        for items in kinds.values():
            taken = len([p for p in picked if p in items])
            if taken < len(items) and len(picked) < MAX_DIAGNOSED:
                picked.append(items[taken])
    return sorted(picked, key=lambda item: item[0].scheduled_s)


def diagnose(group: SentinelGroup | None, lost: list[tuple[Tracked, str]],
             events: list[FaultEvent], partitions: int = 16) -> list[dict[str, Any]]:
    """The first MAX_DIAGNOSED lost tasks, each with what every node holds of it."""
    found = []
    for task, reason in sample_of(lost):
        nodes = {} if group is None else {
            str(n.port): node_state(n.port, task, partitions) if n.running else {"down": True}
            for n in group.nodes}
        found.append({
            "task_id": task.task_id, "key": task.key, "reason": reason,
            "scheduled_s": round(task.scheduled_s, 3),
            "accepted_s": None if task.accepted_s is None else round(task.accepted_s, 3),
            "attempts": [vars(a) for a in task.attempts],
            "first_final": task.first_final, "reread": task.reread,
            "reread_status": task.reread_status, "last_seen": task.last_seen,
            "faults_near": faults_near(task, events), "redis": nodes})
    return found
