"""Tasks in N Redis Streams read through one consumer group (at-least-once).

An entry is read with XREADGROUP (it becomes pending for this consumer), its result is written,
and only then is it acknowledged and deleted (XACK + XDEL), so the streams hold only work that is
not finished. Entries of a consumer that died are taken over with XAUTOCLAIM after an idle time.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ferry import keys
from ferry.codec import EnvelopeError, decode_task, encode_task
from ferry.queue.base import Delivery, dead_letter_fields
from ferry.redis_conn import text
from ferry.results.base import ResultRecord
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)

# XCLAIM ... JUSTID each id (ARGV[3..]) that consumer ARGV[2] of group ARGV[1] still owns.
_TOUCH_OWN = """
for i = 3, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if row[1] and row[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  end
end
return 0
"""



def _delivery(stream: str, entry_id: Any, fields: Any, deliveries: int = 1) -> Delivery:
    raw = (fields or {}).get(keys.TASK_FIELD.encode(), b"")
    try:
        return Delivery(stream, text(entry_id), raw, decode_task(raw), deliveries=deliveries)
    except EnvelopeError as exc:
        return Delivery(stream, text(entry_id), raw, None, str(exc), deliveries)


class RedisStreamQueue:
    """The partition streams, seen by one producer or one consumer of the group."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        partitions: int,
        owned: Sequence[int] = (),
        consumer: str = "",
        pending_ttl_s: int = 86400,
        dead_letter_maxlen: int = 100_000,
    ) -> None:
        self.redis = redis
        self.partitions = partitions
        self.streams = [keys.partition_stream(p) for p in owned]
        self.consumer = consumer
        self.pending_ttl_s = pending_ttl_s
        self.dead_letter_maxlen = dead_letter_maxlen
        self._claim_cursor = {stream: "0-0" for stream in self.streams}
        self._touch = redis.register_script(_TOUCH_OWN)

    async def ensure_groups(self) -> None:
        """Create the consumer group on every owned stream (and the stream itself) if missing."""
        for stream in self.streams:
            try:
                await self.redis.xgroup_create(stream, keys.CONSUMER_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def enqueue(self, task: Task, pending: ResultRecord) -> None:
        """Record the task as PENDING and append it to its partition, atomically."""
        stream = keys.partition_stream(keys.partition_of(task.task_id, self.partitions))
        result_key = keys.result_key(task.task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(result_key, mapping=pending.to_fields())  # type: ignore[arg-type]
            pipe.expire(result_key, self.pending_ttl_s)
            pipe.xadd(stream, {keys.TASK_FIELD: encode_task(task)})
            await pipe.execute()

    async def read(self, count: int, block_ms: int) -> list[Delivery]:
        """Up to ``count`` new entries per owned stream, blocking up to ``block_ms`` for any."""
        if count <= 0 or not self.streams:
            return []
        try:
            reply: Any = await self.redis.xreadgroup(
                keys.CONSUMER_GROUP, self.consumer, dict.fromkeys(self.streams, ">"),
                count=count, block=max(1, block_ms))
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("consumer group missing (Redis flushed?); recreating it")
            await self.ensure_groups()
            return []
        return [_delivery(text(stream), entry_id, fields)
                for stream, entries in reply or [] for entry_id, fields in entries]

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Delivery]:
        """Take over entries other consumers left pending for ``min_idle_ms`` or more."""
        claimed: list[Delivery] = []
        for stream in self.streams:
            claimed.extend(await self._claim_stream(stream, min_idle_ms, count))
        return claimed

    async def _claim_stream(self, stream: str, min_idle_ms: int, count: int) -> list[Delivery]:
        try:
            reply: Any = await self.redis.xautoclaim(
                stream, keys.CONSUMER_GROUP, self.consumer, min_idle_ms,
                start_id=self._claim_cursor[stream], count=count)
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                return []
            raise
        cursor, entries, deleted = reply  # Redis 7: the third item lists deleted entries
        self._claim_cursor[stream] = text(cursor)
        if deleted:  # pending ids whose entries are gone: nothing left to do for them
            await self.redis.xack(stream, keys.CONSUMER_GROUP, *deleted)
        entries = [(entry_id, fields) for entry_id, fields in entries if fields]
        if not entries:
            return []
        counts = await self._delivery_counts(stream, [text(e[0]) for e in entries])
        return [_delivery(stream, entry_id, fields, counts.get(text(entry_id), 1))
                for entry_id, fields in entries]

    async def _delivery_counts(self, stream: str, entry_ids: list[str]) -> dict[str, int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.xpending_range(stream, keys.CONSUMER_GROUP, min=entry_id, max=entry_id,
                                    count=1)
            replies = await pipe.execute()
        return {text(r["message_id"]): int(r["times_delivered"])
                for rows in replies for r in rows}

    async def touch(self, deliveries: Iterable[tuple[str, str]]) -> None:
        """Reset the idle time of entries this consumer still owns and works on.

        A batch may wait at Triton, or for Triton, longer than ``claim_idle_ms``; without this,
        another batcher would take over work that is alive. An entry another consumer has taken
        meanwhile is left to it. JUSTID leaves delivery counts alone.
        """
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id in deliveries:
            by_stream.setdefault(stream, []).append(entry_id)
        if not by_stream:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream, ids in by_stream.items():
                await self._touch(keys=[stream], args=[keys.CONSUMER_GROUP, self.consumer, *ids],
                                  client=pipe)
            await pipe.execute()

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Put unfinished entries back as new ones (delivery count 1), atomically with the ack.

        Used on a clean stop, so that work this batcher never finished is taken at once by
        another, without waiting ``claim_idle_ms`` or counting as a failed delivery.
        """
        async with self.redis.pipeline(transaction=True) as pipe:
            for d in deliveries:
                pipe.xadd(d.stream, {keys.TASK_FIELD: d.raw})
                pipe.xack(d.stream, keys.CONSUMER_GROUP, d.entry_id)
                pipe.xdel(d.stream, d.entry_id)
            await pipe.execute()

    async def forget_consumer(self) -> bool:
        """Remove this consumer from the group if it holds nothing (else its entries would go)."""
        for stream in self.streams:
            rows = await self.redis.xpending_range(stream, keys.CONSUMER_GROUP, min="-",
                                                   max="+", count=1, consumername=self.consumer)
            if rows:
                return False
        for stream in self.streams:
            with contextlib.suppress(ResponseError):
                await self.redis.xgroup_delconsumer(stream, keys.CONSUMER_GROUP, self.consumer)
        return True

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge and delete finished entries (one round trip)."""
        by_stream = _group_ids(deliveries)
        if not by_stream:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            for stream, ids in by_stream.items():
                pipe.xack(stream, keys.CONSUMER_GROUP, *ids)
                pipe.xdel(stream, *ids)
            await pipe.execute()

    async def dead_letter(self, failures: Sequence[tuple[Delivery, str]]) -> None:
        """Copy failed entries, with their last error, to the dead-letter stream."""
        if not failures:
            return
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            for delivery, error in failures:
                pipe.xadd(keys.DEAD_LETTER_STREAM,
                          dead_letter_fields(delivery, error, now),  # type: ignore[arg-type]
                          maxlen=self.dead_letter_maxlen, approximate=True)
            await pipe.execute()

    async def depth(self) -> int:
        """Entries not yet finished, over all partitions (new and pending)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for partition in range(self.partitions):
                pipe.xlen(keys.partition_stream(partition))
            return sum(int(n) for n in await pipe.execute())


def _group_ids(deliveries: Iterable[Delivery]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for delivery in deliveries:
        grouped.setdefault(delivery.stream, []).append(delivery.entry_id)
    return grouped
