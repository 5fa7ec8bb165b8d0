"""Task records in Redis hashes, written atomically with their queue entries by Lua scripts.

Admission is one script: the PENDING record and the stream entry, for every admission that
arrived while the last call was out (``resp.coalesce``). Completion is one script call
for a batch on one Redis (one per partition it touches on a Redis Cluster, all sent in one round
trip): the final records (unless one is there already), the dead letters of failures, the
acknowledgement and deletion of the entries, and one ``PUBLISH`` per gateway process of what was
written, bodies included when small, so that waiting clients are answered without reading Redis
again. Every key a script touches carries its partition's hash tag.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

from ferry import keys, lua
from ferry.codec import dumps, encode_task
from ferry.errors import ServiceUnavailableError
from ferry.priority import BY_URGENCY, Priority
from ferry.resp.client import Arg, Command, Commands
from ferry.resp.cluster import ClusterClient
from ferry.resp.coalesce import Coalescer
from ferry.tasks import scripts
from ferry.tasks.base import (
    NO_LIMITS,
    NO_OWNER,
    NOT_SHARED,
    Admission,
    Admitted,
    Cancellation,
    Completion,
    Owner,
    Sharing,
)
from ferry.tasks.fairness import OFF as fairness_off
from ferry.tasks.fairness import Fairness, rows_of
from ferry.tasks.record import (
    COLLAPSED_INTO,
    EXPIRED_ERROR,
    FOLLOWER_HEAD,
    Encoded,
    Status,
    StoredRecord,
    TaskRecord,
    cancelled_tail,
    status_fragment,
)
from ferry.tasks.replication import ReplicaAcks, Written
from ferry.tasks.scripts import (
    AdmitArgs,
    AdmitItem,
    AdmitKeys,
    AdmitVerdict,
    CancelArgs,
    CancelKeys,
    CompleteArgs,
    CompleteItem,
    CompleteKeys,
    CompleteStream,
    ExpireArgs,
    ExpireKeys,
    HealKeys,
    Withdrawal,
    WithdrawArgs,
    WithdrawKeys,
)
from ferry.usage import ledger
from ferry.v1.task_pb2 import Task

AdmitRow = tuple[AdmitKeys, AdmitItem]  # one admission's KEYS and ARGV in the script's call
INLINE_BODY_LIMIT = 16 * 1024  # larger results are announced by id alone and read on demand
PENDING_STATUS = status_fragment(Status.PENDING)
CANCELLED_STATUS = status_fragment(Status.CANCELLED)
EXPIRED_STATUS = status_fragment(Status.EXPIRED)


class Slot(NamedTuple):
    """The names a partition's scripts use that do not depend on the task, made once."""

    backlog: str
    streams: dict[int, str]  # by priority (a Priority, or the envelope's number for it)
    bells: dict[int, str]
    webhooks: str
    dead_letters: str
    task_prefix: str
    followers_prefix: str
    cache_prefix: str
    fair_queues: dict[int, str]  # by priority, as streams
    fair_states: dict[int, str]

    @classmethod
    def of(cls, partition: int) -> Slot:
        return cls(keys.backlog_key(partition),
                   {p: keys.partition_stream(partition, p) for p in Priority},
                   {p: keys.bell_key(partition, p) for p in Priority},
                   keys.webhook_stream(partition), keys.dead_letter_stream(partition),
                   keys.task_key_prefix(partition), keys.followers_key_prefix(partition),
                   keys.cache_key_prefix(partition),
                   {p: keys.fair_queue(partition, p) for p in Priority},
                   {p: keys.fair_state(partition, p) for p in Priority})


class RedisTaskStore:
    """Task records and their lifecycle, over the lean pipelined client."""

    def __init__(self, client: Commands, *, partitions: int, result_ttl_s: int,  # noqa: PLR0913 - its settings, keyword-only
                 pending_ttl_s: int, dead_letter_maxlen: int = 100_000,
                 inline_limit: int = INLINE_BODY_LIMIT, cache_ttl_s: int = 0,
                 min_replicas: int = 0, wait_ms: int = 500,
                 fairness: Fairness = fairness_off, sharded: bool | None = None,
                 on_admission_call: Callable[[int], None] = lambda items: None) -> None:
        """``on_admission_call`` is told the admissions each call to Redis carries."""
        self.client = client
        self.fairness = fairness
        # With replicas to confirm: every admission that wrote waits for them (or is withdrawn)
        self.acks = ReplicaAcks(client, min_replicas, wait_ms) if min_replicas > 0 else None
        self.partitions = partitions
        self.result_ttl_s = result_ttl_s
        self.pending_ttl_s = pending_ttl_s
        self.dead_letter_maxlen = dead_letter_maxlen
        self.inline_limit = inline_limit
        self.cache_ttl_s = cache_ttl_s
        self._slots = [Slot.of(p) for p in range(partitions)]
        # sharded (None: on a Redis Cluster), the scripts announce in their own slot (SPUBLISH)
        if sharded is None:
            sharded = isinstance(client, ClusterClient)
        self._shards = [keys.slot_tag(p) if sharded else "" for p in range(partitions)]
        self._admit = client.register_script(lua.source(scripts.ADMIT))
        self._admit_args = AdmitArgs(pending_ttl=pending_ttl_s, bell_ms=keys.BELL_MS,
                                     result_ttl=result_ttl_s, group=keys.CONSUMER_GROUP)
        # on a Redis Cluster (or announcing in each partition's slot) a call keeps to one slot
        self._by_partition = isinstance(client, ClusterClient) or sharded
        self.admissions: Coalescer[AdmitRow, tuple[Any, Written | None]] = Coalescer(
            self._admit_all, lambda row: len(row[1].envelope) + len(row[1].pending_body),
            carried=on_admission_call)
        self._complete = client.register_script(lua.source(scripts.COMPLETE))
        self._heal = client.register_script(lua.source(scripts.HEAL))
        self._cancel = client.register_script(lua.source(scripts.CANCEL))
        self._expire = client.register_script(lua.source(scripts.EXPIRE))
        self._review = client.register_script(lua.source(scripts.REVIEW))
        self._withdraw = client.register_script(lua.source(scripts.WITHDRAW))

    def key(self, task_id: str) -> str:
        return keys.task_key(task_id, keys.partition_of(task_id, self.partitions))

    async def admit(self, task: Task, pending: TaskRecord, admission: Admission = NO_LIMITS,
                    sharing: Sharing = NOT_SHARED, owner: Owner = NO_OWNER) -> Admitted:
        """One admission, carried to Redis with those that arrive while the last call of its
        group is out (``resp.coalesce``): one group on one Redis, a partition's on a Cluster
        (a script's keys share a slot there)."""
        partition = keys.partition_of(task.task_id, self.partitions)
        encoded = pending.encode()
        row = (self._admit_keys(task, partition, sharing), self._admit_item(
            task, partition, pending, encoded=encoded, admission=admission, sharing=sharing,
            owner=owner))
        reply, written = await self.admissions.call(partition if self._by_partition else None,
                                                    row)
        verdict, value = scripts.admit_verdict(reply)
        if written is not None and verdict in _WROTE:
            await self._confirm(written, task.task_id, hit=verdict is AdmitVerdict.HIT)
        if verdict is AdmitVerdict.QUEUED:
            return Admitted(StoredRecord(pending.status, encoded.body))
        if verdict is AdmitVerdict.COLLAPSED:
            return Admitted(StoredRecord(pending.status, encoded.body), "collapsed")
        if verdict is AdmitVerdict.HIT:
            return Admitted(StoredRecord(Status.SUCCESS, bytes(value)), "hit")
        priority = Priority.of(task.priority)
        if verdict is AdmitVerdict.BACKLOG_FULL:
            raise admission.backlog_full(task.model, priority, int(value))
        if verdict is AdmitVerdict.OWNER_FULL:
            raise owner.too_many(int(value), self.partitions)
        raise admission.too_slow(task.model, priority, float(value))

    async def _admit_all(self, group: Hashable, rows: list[AdmitRow]
                         ) -> list[tuple[Any, Written | None] | Exception]:
        """One call of the admission script for ``rows``: each one's verdict, and where the
        call was written when replicas must confirm it (one WAIT confirms them all)."""
        command = lua.each_command(self._admit, self._admit_args, rows)
        if self.acks is None:
            replies, written = await self.client.execute(*command), None
        else:
            written = await self.acks.write(rows[0][0].task_key, command)
            replies = written.reply
        # an admission the script failed (its error, caught there) is that caller's alone
        return [reply if isinstance(reply, Exception) else (reply, written) for reply in replies]

    async def _confirm(self, written: Written, task_id: str, *, hit: bool) -> None:
        """Wait until the replicas have the admission; if they do not in time, withdraw it
        (unless a batcher has read it: then it runs, but for nobody) and answer 503."""
        assert self.acks is not None
        if await self.acks.confirmed(written):
            return
        # Withdrawn, or already read by a batcher of a master that may be about to lose it
        # (one that woke from a pause after its failover): either way it is not the client's
        # task. Answered 503, its Idempotency-Key released, the retry is a new admission.
        kept = await self.withdraw(task_id, hit=hit) is Withdrawal.KEPT
        raise self._not_replicated(
            "the task", f", so it was {'abandoned' if kept else 'withdrawn'}: send it again "
            "(with the same Idempotency-Key, the retry is safe)")

    async def reconfirm(self, task_id: str) -> None:
        """Wait until the replicas have what the task's partition holds now (its record among
        it), or answer 503: for a replay of a task whose admission was never confirmed. A write
        in the partition's slot first, so that the WAIT covers everything before it there."""
        if self.acks is None:
            return
        partition = keys.partition_of(task_id, self.partitions)
        written = await self.acks.write(keys.replica_probe_key(partition), (
            "SET", keys.replica_probe_key(partition), task_id, "PX", 60_000))
        if not await self.acks.confirmed(written):
            raise self._not_replicated(f"task {task_id}", ": send it again")

    def _not_replicated(self, subject: str, then: str) -> ServiceUnavailableError:
        """The 503 of an admission (or a replay) the replicas did not confirm in time."""
        assert self.acks is not None
        return ServiceUnavailableError(
            "not_replicated", f"Redis could not confirm within {self.acks.wait_ms} ms that "
            f"{self.acks.replicas} replica(s) have {subject}{then}", retry_after_s=1.0)

    async def withdraw(self, task_id: str, *, hit: bool = False) -> Withdrawal:
        """Take an admission back as if it had never been, unless a batcher has read it,
        others follow it, or it has ended (see withdraw.lua)."""
        slot = self._slots[keys.partition_of(task_id, self.partitions)]
        return Withdrawal(int(await self.client.execute(*self._withdraw.command(
            WithdrawKeys(task_key=slot.task_prefix + task_id, backlog=slot.backlog,
                         followers=slot.followers_prefix + task_id),
            WithdrawArgs(task_id=task_id, group=keys.CONSUMER_GROUP,
                         followers_prefix=slot.followers_prefix, hit=int(hit))))))

    def _admit_keys(self, task: Task, partition: int, sharing: Sharing) -> AdmitKeys:
        slot = self._slots[partition]
        priority = task.priority if task.priority in slot.streams else Priority.of(task.priority)
        return AdmitKeys(
            task_key=slot.task_prefix + task.task_id,
            stream=slot.streams[priority], backlog=slot.backlog,
            normal_stream=slot.streams[Priority.NORMAL], bell_key=slot.bells[priority],
            digest_key=slot.cache_prefix + sharing.digest, webhooks=slot.webhooks,
            fair_queue=slot.fair_queues[priority], fair_state=slot.fair_states[priority])

    def _admit_item(self, task: Task, partition: int, pending: TaskRecord, *, encoded: Encoded,
                    admission: Admission, sharing: Sharing, owner: Owner) -> AdmitItem:
        limits, rate, fixed_wait, timeout = admission.script_args
        lookup = bool(sharing.digest) and sharing.lookup
        collapse = bool(sharing.digest) and sharing.collapse
        slot = self._slots[partition]
        return AdmitItem(
            task_id=task.task_id, pending_body=encoded.body,
            created=dumps(pending.created_at) if collapse else b"",
            envelope=encode_task(task), backlog_prefix=f"{task.model}|", priority=task.priority,
            limit=limits[partition] if admission.limit else 0, rate=rate,
            fixed_wait=fixed_wait, timeout=timeout, lookup=int(lookup), collapse=int(collapse),
            hit_head=pending.hit_head(encoded) if lookup else b"",
            callback=task.callback_url, owner=owner.client_id,
            owner_field=owner.field, owner_limit=owner.pending_limit(partition, self.partitions),
            task_prefix=slot.task_prefix, followers_prefix=slot.followers_prefix,
            fair_after=self.fairness.after, flow=keys.fair_flow(task.client_id, task.model),
            weight=repr(owner.weight or self.fairness.weight(task.client_id)).encode(),
            cost=rows_of(task))

    async def read(self, task_id: str) -> StoredRecord | None:
        status, body = await self.client.execute("HMGET", self.key(task_id), "status", "body")
        if status is None or body is None:
            return None
        return StoredRecord(Status(status.decode()), body)

    async def read_owned(self, task_id: str, client_id: str) -> StoredRecord | None:
        """The record if the task belongs to ``client_id``: another client's task is as unknown
        as no task."""
        status, body, owner = await self.client.execute("HMGET", self.key(task_id), "status",
                                                        "body", "owner")
        if status is None or body is None or owner != client_id.encode():
            return None
        return StoredRecord(Status(status.decode()), body)

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """Settle a batch's deliveries: one call of the completion script for all of them on one
        Redis (one announcement per gateway process), one per partition on a Redis Cluster (or
        when announcing in each partition's slot), all sent in one round trip."""
        if not completions:
            return []
        streams: dict[tuple[int, str], list[int]] = {}
        for index, completion in enumerate(completions):
            delivery = completion.delivery
            streams.setdefault((delivery.partition, delivery.stream), []).append(index)
        calls: dict[int | None, list[tuple[int, str]]] = {}
        for partition, stream in streams:
            calls.setdefault(partition if self._by_partition else None, []).append(
                (partition, stream))
        now = repr(time.time())
        commands = [self._completion(call, streams, completions, now) for call in calls.values()]
        replies = await self.client.pipeline(commands)
        written = [False] * len(completions)
        for call, flags in zip(calls.values(), replies, strict=True):
            order = [index for key in call for index in streams[key]]
            for index, flag in zip(order, flags, strict=True):
                written[index] = bool(flag)
        return written

    def _completion(self, call: list[tuple[int, str]], streams: dict[tuple[int, str], list[int]],
                    completions: Sequence[Completion], now: str) -> Command:
        """One call for ``call``'s streams: each stream's keys and arguments, then its items."""
        hour = ledger.hour_of(float(now))
        rows: list[tuple[CompleteKeys, CompleteStream]] = []
        task_keys: list[Arg] = []
        items: list[Arg] = []
        for partition, stream in call:
            slot = self._slots[partition]
            indexes = streams[(partition, stream)]
            rows.append((CompleteKeys(stream=stream, dead_letters=slot.dead_letters,
                                      backlog=slot.backlog, webhooks=slot.webhooks),
                         CompleteStream(task_prefix=slot.task_prefix,
                                        followers_prefix=slot.followers_prefix,
                                        cache_prefix=slot.cache_prefix,
                                        ledger=keys.ledger_key(partition, hour),
                                        entries=len(indexes))))
            for index in indexes:
                item = completions[index]
                if item.record is not None:
                    task_keys.append(slot.task_prefix + item.record.task_id)
                items += completion_item(item)
        args = CompleteArgs(
            group=keys.CONSUMER_GROUP, result_ttl=self.result_ttl_s,
            dead_letter_maxlen=self.dead_letter_maxlen, inline_limit=self.inline_limit,
            failed_at=now, cache_ttl=self.cache_ttl_s, collapsed_into=COLLAPSED_INTO,
            follower_head=FOLLOWER_HEAD, ledger_ttl=keys.LEDGER_TTL_S,
            shard=self._shards[call[0][0]], streams=len(call))
        return lua.each_command(self._complete, args, rows, task_keys, items)

    async def write_review(self, task_id: str, marker: bytes, review: bytes, url: str) -> bool:
        """Put a review's end in place of its pending entry in the reviewed task's record (and
        queue that task's webhook again, with a ``url``); False if the record has no such
        entry (expired, or the task ran again with a review of its own)."""
        partition = keys.partition_of(task_id, self.partitions)
        names = scripts.ReviewKeys(keys.task_key(task_id, partition),
                                   keys.webhook_stream(partition))
        args = scripts.ReviewArgs(task_id, marker, review, url)
        return bool(await self.client.execute(*self._review.command(names, args)))

    async def cancel(self, task_id: str, client_id: str = "") -> Cancellation:
        """Cancel a task that has not reached Triton (see ``CancelOutcome``); with
        ``client_id``, only a task of that client."""
        partition = keys.partition_of(task_id, self.partitions)
        slot = self._slots[partition]
        return scripts.cancellation(await self.client.execute(*self._cancel.command(
            CancelKeys(task_key=slot.task_prefix + task_id, backlog=slot.backlog,
                       followers=slot.followers_prefix + task_id, webhooks=slot.webhooks),
            CancelArgs(task_id=task_id, client_id=client_id, group=keys.CONSUMER_GROUP,
                       result_ttl=self.result_ttl_s,
                       cancel_channel=keys.CANCEL_CHANNEL, pending_status=PENDING_STATUS,
                       cancelled_status=CANCELLED_STATUS,
                       cancelled_tail=cancelled_tail(time.time()),
                       followers_prefix=slot.followers_prefix, shard=self._shards[partition]))))

    async def expire(self, task_id: str) -> StoredRecord | None:
        """End the task EXPIRED unless it has a final record (see expire.lua): its deadline has
        passed. The final record either way; None if unknown, or others follow it."""
        partition = keys.partition_of(task_id, self.partitions)
        slot = self._slots[partition]
        return scripts.expiry(await self.client.execute(*self._expire.command(
            ExpireKeys(task_key=slot.task_prefix + task_id, backlog=slot.backlog,
                       followers=slot.followers_prefix + task_id, webhooks=slot.webhooks),
            ExpireArgs(task_id=task_id, group=keys.CONSUMER_GROUP, result_ttl=self.result_ttl_s,
                       pending_status=PENDING_STATUS, expired_status=EXPIRED_STATUS,
                       expired_tail=cancelled_tail(time.time(), EXPIRED_ERROR),
                       followers_prefix=slot.followers_prefix, shard=self._shards[partition]))))

    async def cancel_requested(self, task_ids: Sequence[str]) -> list[bool]:
        """Whether each task was flagged for cancellation (for tasks a batcher reclaims)."""
        if not task_ids:
            return []
        replies = await self.client.pipeline([("HGET", self.key(t), "cancel") for t in task_ids])
        return [reply is not None for reply in replies]

    async def heal_backlog(self, partitions: Sequence[int]) -> int:
        """Reset the backlog counts of partitions that have no unfinished task; how many were."""
        if not partitions:
            return 0
        replies = await self.client.pipeline([
            self._heal.command([*HealKeys(backlog=keys.backlog_key(p)),
                                *keys.partition_streams(p),
                                *(keys.fair_queue(p, priority) for priority in BY_URGENCY)], [])
            for p in partitions])
        return sum(int(r) for r in replies)

    async def backlog(self, model: str) -> dict[Priority, int]:
        """The model's unfinished tasks by priority, over all partitions."""
        fields = [keys.backlog_field(model, p) for p in BY_URGENCY]
        replies = await self.client.pipeline([
            ("HMGET", keys.backlog_key(p), *fields) for p in range(self.partitions)])
        totals = dict.fromkeys(BY_URGENCY, 0)
        for counts in replies:
            for priority, count in zip(BY_URGENCY, counts, strict=True):
                totals[priority] += int(count or 0)
        return totals


_WROTE = frozenset({AdmitVerdict.QUEUED, AdmitVerdict.COLLAPSED, AdmitVerdict.HIT})


@functools.lru_cache(maxsize=1024)
def backlog_field(model: str, priority: int) -> str:
    """The backlog count a task of the model and the envelope's priority number is under."""
    return keys.backlog_field(model, Priority.of(priority))


def completion_item(item: Completion) -> CompleteItem:
    """One delivery's arguments to the completion script."""
    delivery, record = item.delivery, item.record
    task = delivery.task
    if record is None or task is None:  # an unreadable entry: acknowledged and dead-lettered
        return CompleteItem(
            entry_id=delivery.entry_id, task_id="", status="", body=b"", head_end=0,
            answer_from=0, dead_letter=item.dead_letter or "",
            envelope=delivery.raw if item.dead_letter else b"",
            deliveries=delivery.deliveries, backlog_field="", digest="", callback="",
            ledger_field="", rows=0, gpu_us=0)
    encoded = record.encode()
    reused = item.reusable and encoded.answer_at > 0
    return CompleteItem(
        entry_id=delivery.entry_id, task_id=record.task_id, status=record.status.value,
        body=encoded.body, head_end=encoded.head_end,
        answer_from=encoded.answer_at + 1 if reused else 0,
        dead_letter=item.dead_letter or "", envelope=delivery.raw if item.dead_letter else b"",
        deliveries=delivery.deliveries,
        backlog_field=backlog_field(task.model, task.priority),
        digest=task.input_digest, callback=task.callback_url,
        ledger_field=ledger.field_prefix(ledger.client_of(task), task.model), rows=item.rows,
        gpu_us=item.gpu_us)
