"""Tasks in N Redis Streams read through one consumer group (at-least-once).

An entry is read with XREADGROUP (it becomes pending for this consumer), its result is written,
and only then is it acknowledged and deleted (by the task store, in the same script as the
result), so the streams hold only work that is not finished. Entries of a consumer that died are
taken over with XAUTOCLAIM after an idle time.

Reading is the hot path and goes through a lean client of its own (the read blocks); the rest
(groups, reclaim, keep-alive, hand-back, depth) is occasional and shares the batcher's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ferry import keys, lua
from ferry.errors import RedisCommandError
from ferry.priority import BY_URGENCY, Priority
from ferry.queue import entries as entry
from ferry.queue.base import Delivery
from ferry.queue.handover import RiderMove
from ferry.redis_conn import ensure_group, text
from ferry.resp.client import Commands, Packed
from ferry.resp.cluster import ClusterClient

log = logging.getLogger(__name__)
UNBLOCK_TRIES = 50  # a blocked read not yet at Redis when told to stop: asked again, 2 ms apart
AWAKE_S = 2.0  # a priority rung (or read) this recently is read too: longer than a bell's period
# A sleeping priority is still polled this often: its doorbell is an entry in the normal stream,
# which under a normal backlog is read only after the entries ahead of it.
SLEEPING_POLL_S = 0.25


class TouchKeys(NamedTuple):
    stream: str


class TouchArgs(NamedTuple):
    group: str
    consumer: str


class TouchItem(NamedTuple):
    entry_id: str


# Resets the idle time of the entries the consumer still owns; answers how many it touched.
TOUCH_OWN = lua.ScriptSpec("ferry.queue", "touch_own", TouchKeys._fields, TouchArgs._fields,
                           item=TouchItem._fields)


class BeatKeys(NamedTuple):
    registry: str


class BeatArgs(NamedTuple):
    consumer: str
    lease_ms: int


# Renews a batcher's lease at Redis's clock; answers the batchers whose lease ran out.
BEAT = lua.ScriptSpec("ferry.queue", "beat", BeatKeys._fields, BeatArgs._fields,
                      constants=(("BATCHERS_TTL_MS", keys.BATCHERS_TTL_MS),))


class RescueKeys(NamedTuple):
    stream: str


class RescueArgs(NamedTuple):
    group: str
    dead: str
    consumer: str
    limit: int


class ReleaseKeys(NamedTuple):
    stream: str


class ReleaseArgs(NamedTuple):
    group: str
    consumer: str


class ReleaseItem(NamedTuple):
    entry_id: str
    envelope: bytes


# Puts back, as new entries, those the consumer still holds; answers how many.
RELEASE = lua.ScriptSpec("ferry.queue", "release", ReleaseKeys._fields, ReleaseArgs._fields,
                         item=ReleaseItem._fields, constants=(("TASK_FIELD", keys.TASK_FIELD),),
                         fragments=("entries",))


# Takes over a dead consumer's entries in one stream; answers them and whether any are left.
RESCUE = lua.ScriptSpec("ferry.queue", "rescue", RescueKeys._fields, RescueArgs._fields)


class FairReadKeys(NamedTuple):
    stream: str
    fair_queue: str
    fair_state: str


class FairReadArgs(NamedTuple):
    group: str
    consumer: str
    want: int
    task_prefix: str


# Reads a stream, then moves the fair queue's tasks to it in fair order and reads them too.
FAIR_READ = lua.ScriptSpec("ferry.queue", "fair_read", FairReadKeys._fields,
                           FairReadArgs._fields,
                           constants=(("PENDING", "PENDING"), ("TASK_FIELD", keys.TASK_FIELD)),
                           fragments=("ferry.tasks:fair_flow", "entries"))


class RedisStreamQueue:
    """The partition streams, seen by one consumer of the group."""

    _live = 1  # batchers with a live lease, as the last beat counted them (1: before it)

    def __init__(self, redis: Commands, reader: Commands, *, partitions: int,
                 owned: Sequence[int], consumer: str, clock: Callable[[], float] = time.monotonic,
                 blocker: Callable[[], ClusterClient] | None = None) -> None:
        """``redis`` carries the occasional commands (the batcher's shared client); ``reader``
        reads (on one Redis it blocks: a connection of its own; on a Redis Cluster, a
        ``ClusterClient``, a blocking read of one partition waits on one ``blocker`` makes)."""
        self.redis = redis
        self.reader = reader
        self._blocker = blocker
        self._blockers: dict[int, ClusterClient] = {}
        self.partitions = partitions
        self.owned = tuple(owned)
        self.by_priority = {priority: [keys.partition_stream(p, priority) for p in self.owned]
                            for priority in BY_URGENCY}
        self.streams = [s for priority in BY_URGENCY for s in self.by_priority[priority]]
        self._partition_of_stream = {
            keys.partition_stream(p, priority).encode(): p
            for p in self.owned for priority in BY_URGENCY}
        self._priority_of_stream = {
            keys.partition_stream(p, priority).encode(): priority
            for p in self.owned for priority in BY_URGENCY}
        self.clock = clock
        started = clock()  # read every priority at first: work may be waiting from before
        self._rung = dict.fromkeys(BY_URGENCY, started)
        self._polled = started
        self.consumer = consumer
        self._claim_cursor = {stream: "0-0" for stream in self.streams}
        self._read_commands: dict[tuple[tuple[Priority, ...], int, int, int | None],
                                  Packed] = {}
        self._regroup = False  # a partition's read found its group gone: recreate the groups
        self._touch = redis.register_script(lua.source(TOUCH_OWN))
        self._beat = redis.register_script(lua.source(BEAT))
        self._rescue = redis.register_script(lua.source(RESCUE))
        self._release = redis.register_script(lua.source(RELEASE))
        self._fair_read = reader.register_script(lua.source(FAIR_READ))
        # (partition, priority) whose fair queue may hold tasks, read through it: all at first
        # (tasks may wait from before), then as fair doorbells ring (or a recheck finds them)
        self.fair_waiting = set(self.fair_pairs)
        # every partition's streams: a dead batcher's entries are taken over wherever they are
        self.all_streams = [(p, s) for p in range(partitions) for s in keys.partition_streams(p)]

    async def ensure_groups(self) -> None:
        """Create the consumer group on every owned stream (and the stream itself) if missing."""
        for stream in self.streams:
            await ensure_group(self.redis, stream, keys.CONSUMER_GROUP)

    async def read(self, count: int, block_ms: int,
                   priorities: Sequence[Priority] = BY_URGENCY) -> list[Delivery]:
        """Up to ``count`` new entries per owned stream of the given priorities, blocking up to
        ``block_ms`` for any (0: only what is there now); most urgent first."""
        if count <= 0 or not self.streams or not priorities:
            return []
        fair = [pair for pair in sorted(self.fair_waiting) if pair[1] in priorities]
        deliveries: list[Delivery] = []
        bells: list[tuple[str, Any]] = []
        if fair:
            deliveries = await self._read_fair(fair, count, bells)
            block_ms = 0  # work waits in fair order: no reason to block
        reply = await self._fetch(tuple(priorities), count, block_ms)
        for stream, entries in reply or ():
            partition = self._partition_of_stream[stream]
            name = stream.decode()
            if entries and self._priority_of_stream[stream] is not Priority.NORMAL:
                self._rung[self._priority_of_stream[stream]] = self.clock()
            for entry_id, fields in entries:
                raw = entry.task_field(fields)
                if not raw and self._rings(fields, partition):
                    bells.append((name, entry_id))
                else:
                    deliveries.append(entry.delivery(partition, name, entry_id, raw))
        if bells:
            await self._answer(bells)
        return deliveries

    async def _read_fair(self, pairs: Sequence[tuple[int, Priority]], count: int,
                         bells: list[tuple[str, Any]]) -> list[Delivery]:
        """Up to ``count`` entries of each (partition, priority)'s stream, then of its fair
        queue in fair order (``fair_read.lua``), every pair in one round trip; a pair whose fair
        queue is empty is read the plain way from then on. A pair whose read failed keeps its
        place for the next read (what the others read is not dropped)."""
        replies = await self.reader.replies([self._fair_read.command(
            FairReadKeys(keys.partition_stream(p, priority), keys.fair_queue(p, priority),
                         keys.fair_state(p, priority)),
            FairReadArgs(keys.CONSUMER_GROUP, self.consumer, count, keys.task_key_prefix(p)))
            for p, priority in pairs])
        deliveries: list[Delivery] = []
        failed: BaseException | None = None
        for (partition, priority), reply in zip(pairs, replies, strict=True):
            if isinstance(reply, BaseException):
                failed = reply
                continue
            entries, left = reply
            if not int(left):
                self.fair_waiting.discard((partition, priority))
            stream = keys.partition_stream(partition, priority)
            for entry_id, fields in entries or ():
                raw = entry.task_field(fields)
                if not raw and self._rings(fields, partition):
                    bells.append((stream, entry_id))  # answered with the plain read's
                else:
                    deliveries.append(entry.delivery(partition, stream, entry_id, raw))
        if failed is not None:
            if isinstance(failed, RedisCommandError) and failed.code == "NOGROUP":
                self._regroup = True
            elif not deliveries:
                raise failed
            log.warning("a fair read failed: %s", failed)
        return deliveries

    @property
    def fair_pairs(self) -> list[tuple[int, Priority]]:
        """Every (partition, priority) this consumer owns: each has its fair queue."""
        return [(p, priority) for p in self.owned for priority in BY_URGENCY]

    async def recheck_fair(self) -> None:
        """Find fair queues that hold tasks though no doorbell was heard (a batcher that read
        it died before reading the queue): cheap, one EXISTS per owned queue."""
        pairs = self.fair_pairs
        found = await self.reader.pipeline([("EXISTS", keys.fair_queue(p, priority))
                                            for p, priority in pairs])
        self.fair_waiting.update(pair for pair, there in zip(pairs, found, strict=True)
                                 if int(there))

    async def _fetch(self, priorities: tuple[Priority, ...], count: int, block_ms: int
                     ) -> Any:
        """XREADGROUP's reply: ``[[stream, [[id, fields], ...]], ...]`` or None."""
        try:
            if isinstance(self.reader, ClusterClient):
                reply: Any = await self._read_slots(self.reader, priorities, count, block_ms)
            else:
                reply = await self.reader.execute(
                    self._read_command(priorities, count, block_ms),
                    timeout_s=self.reader.timeout_s + max(0, block_ms) / 1000.0)
        except RedisCommandError as exc:
            # NOGROUP: the group is gone; UNBLOCKED: the stream was deleted under a blocked read
            if exc.code not in ("NOGROUP", "UNBLOCKED"):
                raise
            log.warning("consumer group missing (Redis flushed?); recreating it: %s", exc)
            await self.ensure_groups()
            return None
        if self._regroup:
            self._regroup = False
            await self.ensure_groups()
        return reply

    async def _read_slots(self, cluster: ClusterClient, priorities: tuple[Priority, ...],
                          count: int, block_ms: int) -> list[Any]:
        """On a Redis Cluster: one XREADGROUP per partition (its streams share a slot), all at
        once. If none has entries and ``block_ms`` allows, a blocking read per partition, each on
        a connection of its own; when the first answers, the others are unblocked (CLIENT
        UNBLOCK, all at once) and every reply is kept, so no entry read is left behind."""
        reply = self._slot_replies(await cluster.replies(
            [self._read_command(priorities, count, 0, p) for p in self.owned]))
        if any(entries for _, entries in reply) or block_ms <= 0:
            return reply
        waits = {asyncio.ensure_future(self._blocking(p).execute(
            self._read_command(priorities, count, block_ms, p),
            timeout_s=cluster.timeout_s + block_ms / 1000.0)): p for p in self.owned}
        try:
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            ended = await asyncio.gather(
                *(self._unblock(cluster, wait, waits[wait]) for wait in pending),
                return_exceptions=True)  # one master out of reach: the others' replies count
            if failed := next((e for e in ended if isinstance(e, BaseException)), None):
                log.warning("ending a blocked read failed (it ends at its timeout): %s", failed)
            replies = await asyncio.gather(*waits, return_exceptions=True)
        finally:
            for wait in waits:
                wait.cancel()
        return self._slot_replies(replies)

    def _slot_replies(self, replies: Sequence[Any]) -> list[Any]:
        """The partitions' replies as one XREADGROUP's; an error reply is raised only if no
        partition answered (entries read from the others must not be dropped)."""
        found = [row for reply in replies if isinstance(reply, list) for row in reply]
        errors = [reply for reply in replies if isinstance(reply, BaseException)]
        if not errors:
            return found
        if not found:
            raise errors[0]
        log.warning("reading %d partition(s) failed: %s", len(errors), errors[0])
        if any(str(e).startswith(("NOGROUP", "UNBLOCKED")) for e in errors):
            self._regroup = True
        return found

    def _blocking(self, partition: int) -> ClusterClient:
        client = self._blockers.get(partition)
        if client is None:
            assert self._blocker is not None, "a cluster reader needs a blocker factory"
            client = self._blockers[partition] = self._blocker()
        return client

    async def _unblock(self, cluster: ClusterClient, wait: asyncio.Future[Any],
                       partition: int) -> None:
        """End a partition's blocking read early (it then answers as if it timed out)."""
        stream = keys.partition_stream(partition)
        blocked = await self._blocking(partition).node_of(stream)
        control = await cluster.node_of(stream)
        for _ in range(UNBLOCK_TRIES):
            client_id = blocked.connection_id
            if wait.done() or (client_id is not None and await control.execute(
                    "CLIENT", "UNBLOCK", client_id) == 1):
                return
            await asyncio.sleep(0.002)  # the read may not have reached Redis yet

    def awake(self, holding: Iterable[Priority] = (), *, poll: bool = False) -> list[Priority]:
        """The priorities to read, most urgent first: normal always; another while its doorbell
        rang, or its tasks were read, within ``AWAKE_S``, or while this batcher holds some.
        With ``poll``, every priority once per ``SLEEPING_POLL_S``: a doorbell behind a normal
        backlog waits its turn, a high-priority task must not."""
        now = self.clock()
        for priority in holding:
            self._rung[priority] = now
        if poll and now - self._polled >= SLEEPING_POLL_S:
            self._polled = now
            return list(BY_URGENCY)
        return [p for p in BY_URGENCY
                if p is Priority.NORMAL or now - self._rung[p] < AWAKE_S]

    def _rings(self, fields: Any, partition: int) -> bool:
        """Whether the entry is a doorbell, and for which priority (it wakes that priority; a
        fair doorbell: its fair queue is read from now)."""
        value = entry.field(fields, keys.BELL_FIELD)
        if value is None:
            fair = entry.field(fields, keys.FAIR_FIELD)
            if fair is None:
                return False
            with contextlib.suppress(ValueError):
                priority = Priority.of(int(fair))
                self.fair_waiting.add((partition, priority))
                self._rung[priority] = self.clock()
            return True
        with contextlib.suppress(ValueError):
            self._rung[Priority.of(int(value))] = self.clock()
        return True

    async def _answer(self, bells: Sequence[tuple[str, Any]]) -> None:
        """Acknowledge and delete doorbell entries (they carry no task)."""
        await self.redis.pipeline([
            command for stream, entry_id in bells
            for command in (("XACK", stream, keys.CONSUMER_GROUP, entry_id),
                            ("XDEL", stream, entry_id))])

    def _read_command(self, priorities: tuple[Priority, ...], count: int,
                      block_ms: int, partition: int | None = None) -> Packed:
        """XREADGROUP over the owned streams of ``priorities`` (only ``partition``'s, if given),
        packed once per arguments."""
        key = (priorities, count, block_ms, partition)
        command = self._read_commands.get(key)
        if command is None:
            block = ("BLOCK", block_ms) if block_ms > 0 else ()
            streams = ([s for priority in priorities for s in self.by_priority[priority]]
                       if partition is None else
                       [keys.partition_stream(partition, priority) for priority in priorities])
            command = self._read_commands[key] = Packed.of(
                ("XREADGROUP", "GROUP", keys.CONSUMER_GROUP, self.consumer, "COUNT", count,
                 *block, "STREAMS", *streams, *(">" for _ in streams)), streams[0])
        return command

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Delivery]:
        """Take over entries other consumers left pending for ``min_idle_ms`` or more."""
        claimed: list[Delivery] = []
        for stream in self.streams:
            partition = self._partition_of_stream[stream.encode()]
            claimed.extend(await self._claim_stream(partition, stream, min_idle_ms, count))
        return claimed

    async def _claim_stream(self, partition: int, stream: str, min_idle_ms: int,
                            count: int) -> list[Delivery]:
        try:
            reply: Any = await self.redis.execute(
                "XAUTOCLAIM", stream, keys.CONSUMER_GROUP, self.consumer, min_idle_ms,
                self._claim_cursor[stream], "COUNT", count)
        except RedisCommandError as exc:
            if exc.code == "NOGROUP":  # the group is gone: the reader makes it again
                return []
            raise
        cursor, entries, deleted = reply  # Redis 7: the third item lists deleted entries
        self._claim_cursor[stream] = text(cursor)
        if deleted:  # pending ids whose entries are gone: nothing left to do for them
            await self.redis.execute("XACK", stream, keys.CONSUMER_GROUP, *deleted)
        entries = [(entry_id, fields) for entry_id, fields in entries if fields]
        bells = [(stream, e) for e, fields in entries
                 if not entry.task_field(fields) and self._rings(fields, partition)]
        if bells:  # a dead consumer's doorbells: answered, and they wake their priority here
            await self._answer(bells)
            rung = {e for _, e in bells}
            entries = [(e, f) for e, f in entries if e not in rung]
        if not entries:
            return []
        counts = await self._delivery_counts(stream, [text(e[0]) for e in entries])
        return [entry.delivery(partition, stream, entry_id, entry.task_field(fields),
                          counts.get(text(entry_id), 1))
                for entry_id, fields in entries]

    async def _delivery_counts(self, stream: str, entry_ids: list[str]) -> dict[str, int]:
        replies = await self.redis.pipeline([
            ("XPENDING", stream, keys.CONSUMER_GROUP, entry_id, entry_id, 1)
            for entry_id in entry_ids])
        return {text(entry_id): int(times)  # each row: id, consumer, idle ms, deliveries
                for rows in replies for entry_id, _, _, times in rows}

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
        await asyncio.gather(*(  # one script per stream (each in its own slot), all at once
            self._touch_stream(stream, ids) for stream, ids in by_stream.items()))

    async def _touch_stream(self, stream: str, entry_ids: list[str]) -> None:
        try:
            await self.redis.execute(*self._touch.command(
                TouchKeys(stream=stream),
                [*TouchArgs(group=keys.CONSUMER_GROUP, consumer=self.consumer),
                 *lua.items(TouchItem(entry_id) for entry_id in entry_ids)]))
        except RedisCommandError as exc:
            if exc.code != "NOGROUP":  # the group is gone (Redis lost it): nothing is owned
                raise

    @functools.cached_property
    def _riders(self) -> RiderMove:
        return RiderMove(self.redis, self.consumer, self.all_streams)

    async def take_riders(self, riders: Sequence[tuple[str, str, str]]) -> list[Delivery]:
        """Move entries other batchers offered to a shared budget to this consumer, with their
        tasks (``queue.handover``)."""
        return await self._riders.move(riders)

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Put unfinished entries back as new ones (delivery count 1), atomically with the ack.

        Used on a clean stop, so that work this batcher never finished is taken at once by
        another, without waiting ``claim_idle_ms`` or counting as a failed delivery. An entry
        another consumer has taken meanwhile is left to it (put back, it would run twice).
        """
        by_stream: dict[str, list[Delivery]] = {}
        for delivery in deliveries:
            by_stream.setdefault(delivery.stream, []).append(delivery)
        await self.redis.pipeline([  # a script per stream (one slot each), in one round trip
            self._release.command(
                ReleaseKeys(stream),
                [*ReleaseArgs(keys.CONSUMER_GROUP, self.consumer),
                 *lua.items(ReleaseItem(d.entry_id, d.raw) for d in held)])
            for stream, held in by_stream.items()])

    async def beat(self, lease_ms: int) -> list[str]:
        """Renew this consumer's lease; the consumers whose lease has run out (and, in
        ``live_batchers``, how many hold a live one)."""
        reply = await self.redis.execute(*self._beat.command(
            BeatKeys(keys.BATCHERS_KEY), BeatArgs(self.consumer, lease_ms)))
        self._live = int(reply[0])
        return [text(name) for name in reply[1:]]

    def live_batchers(self) -> int:
        """Batchers holding a live lease at the last beat (this one included; 1 before it)."""
        return self._live

    async def rescue(self, dead: str, room: int) -> tuple[list[Delivery], bool]:
        """Take over up to ``room`` entries that the dead consumer held, stream by stream (one
        script each: no two rescuers share an entry); and whether it still holds any (there
        was no room for them). A stream where it holds nothing loses it from its group."""
        rescued: list[Delivery] = []
        for partition, stream in self.all_streams:
            if len(rescued) >= room:
                return rescued, True
            try:
                entries, counts, left = await self.redis.execute(*self._rescue.command(
                    RescueKeys(stream),
                    RescueArgs(keys.CONSUMER_GROUP, dead, self.consumer, room - len(rescued))))
            except RedisCommandError as exc:
                if exc.code == "NOGROUP":  # a stream nobody has read: nothing held there
                    continue
                raise
            rescued += [entry.delivery(partition, stream, entry_id, entry.task_field(fields),
                                       int(n))
                        for (entry_id, fields), n in zip(entries, counts, strict=True)]
            if left:
                return rescued, True
        return rescued, False

    async def bury(self, dead: str) -> None:
        """Forget a dead consumer's lease once it holds nothing (a consumer that comes back
        beats again: absent is not dead)."""
        await self.redis.execute("HDEL", keys.BATCHERS_KEY, dead)

    async def forget_consumer(self) -> bool:
        """Remove this consumer from the group if it holds nothing (else its entries would go)."""
        for stream in self.streams:
            rows = await self.redis.execute("XPENDING", stream, keys.CONSUMER_GROUP, "-", "+", 1,
                                            self.consumer)
            if rows:
                return False
        for stream in self.streams:
            with contextlib.suppress(RedisCommandError):
                await self.redis.execute("XGROUP", "DELCONSUMER", stream, keys.CONSUMER_GROUP,
                                         self.consumer)
        # its lease: gone, not dead
        await self.redis.execute("HDEL", keys.BATCHERS_KEY, self.consumer)
        return True

    async def depth(self) -> int:
        """Entries not yet finished, over all partitions and priorities (new and pending)."""
        return sum(int(n) for n in await self.redis.pipeline([
            ("XLEN", stream) for partition in range(self.partitions)
            for stream in keys.partition_streams(partition)]))

    async def partition_stats(self) -> dict[int, tuple[int, int]]:
        """For each owned partition: its unfinished entries (all priorities) and how many of
        them a batcher holds (delivered, not yet acknowledged)."""
        replies = await self.redis.replies([  # a stream without its group answers NOGROUP
            command for partition in self.owned for stream in keys.partition_streams(partition)
            for command in (("XLEN", stream), ("XPENDING", stream, keys.CONSUMER_GROUP))])
        stats: dict[int, tuple[int, int]] = {}
        per_partition = 2 * len(BY_URGENCY)
        for index, partition in enumerate(self.owned):
            chunk = replies[index * per_partition:(index + 1) * per_partition]
            depth = sum(int(n) for n in chunk[0::2] if isinstance(n, int))
            held = sum(int(p[0]) for p in chunk[1::2] if isinstance(p, list))  # its count first
            stats[partition] = (depth, held)
        return stats

    async def close(self) -> None:
        await self.reader.close()
        for client in self._blockers.values():
            await client.close()
