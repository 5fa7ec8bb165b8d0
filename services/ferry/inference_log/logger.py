"""``ferry logger``: drains the models' log streams into the sink.

It reads each logged model's stream through one consumer group (``ferry-loggers``: several
loggers share the work), gives what it read to the sink, and acknowledges and deletes an entry
only once the sink holds it (a file committed, an event answered 2xx): at-least-once. A sink
that fails is retried with capped exponential backoff, reading nothing new meanwhile, so its
entries wait in the streams (the batchers drop, and count, what a full stream has no room
for); after a failure the logger reads again, from its own pending entries, what the sink did
not hold. A logger that dies leaves its entries pending; another takes them over once they
have been idle ``CLAIM_IDLE_MS`` (a live logger reads its pending entries again on every retry,
so they never idle that long).

``start`` and ``stop``; signals only set an event; ``stop`` commits the open files and
acknowledges what they hold, within ``STOP_GRACE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from ferry import keys
from ferry.backoff import backoff_delay
from ferry.errors import RedisCommandError, RedisError, RedisUnavailableError
from ferry.inference_log.sinks import Entry, Sink, SinkError
from ferry.redis_conn import ensure_group, text
from ferry.resp.client import Commands
from ferry.telemetry.http import StatusServer
from ferry.telemetry.metrics import LoggerMetrics

log = logging.getLogger(__name__)
READ_COUNT = 500  # entries per stream per read
BLOCK_MS = 1000  # a read waits this long for a record (files are rotated by age meanwhile)
POLL_S = 0.5  # on a Redis Cluster (no blocking read over many slots): the pause when idle
CLAIM_IDLE_MS = 120_000
CLAIM_EVERY_S = 30.0
MEASURE_EVERY_S = 5.0
RETRY_BASE_S, RETRY_MAX_S = 0.5, 30.0
STOP_GRACE_S = 30.0
NEW = ">"


def consumer_name() -> str:
    """Unique per process, readable in XINFO CONSUMERS."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Logger:
    """Start, stop: writes the logged models' records to the sink."""

    def __init__(self, models: Sequence[str], redis: Commands, sink: Sink,
                 metrics: LoggerMetrics, *, reader: Commands | None = None,
                 consumer: str = "", metrics_at: tuple[str, int] | None = None,
                 retry_max_s: float = RETRY_MAX_S,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        """``redis`` carries the commands; ``reader`` the blocking reads (a connection of its
        own; None: ``redis``, polled, as on a Redis Cluster, whose streams are in many
        slots); ``metrics_at``, the (host, port) of its /metrics, /healthz and /readyz."""
        self.streams = {keys.log_key(model): model for model in models}
        self.redis, self.reader = redis, reader
        self.sink = sink
        self.metrics = metrics
        self.consumer = consumer or consumer_name()
        self.status = None if metrics_at is None else StatusServer(
            *metrics_at, metrics.registry, live=self.liveness, ready=self.readiness)
        self.sleep = sleep
        self.retry_max_s = retry_max_s  # the longest wait before the sink is tried again
        self.failures = 0  # the sink's failures in a row (0: it takes records)
        self.rounds = 0  # reads done: tests wait on it
        self._cursors = dict.fromkeys(self.streams, "0")  # first, what this consumer holds
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last = {"claim": 0.0, "measure": 0.0}

    async def start(self) -> None:
        for stream in self.streams:
            await ensure_group(self.redis, stream, keys.LOG_GROUP)
        self.metrics.prime(self.streams.values())
        if self.status is not None:
            await self.status.start()
        self._task = asyncio.create_task(self._loop(), name="ferry-logger")
        log.info("logger %s writes %s", self.consumer, ", ".join(self.streams.values()))

    async def stop(self) -> None:
        """Stop reading; commit what the sink holds open and acknowledge it. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._task is not None:
            done, _ = await asyncio.wait([self._task], timeout=STOP_GRACE_S)
            if not done:  # a write that hangs: cut short, its entries stay pending
                self._task.cancel()
                await asyncio.wait([self._task], timeout=STOP_GRACE_S)
        with contextlib.suppress(SinkError, RedisError, TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await self._ack(await self.sink.close())
                await self._forget()
        if self.status is not None:
            await self.status.close()
        for client in {id(c): c for c in (self.reader, self.redis) if c is not None}.values():
            await client.close()

    async def run(self) -> int:
        """Run until SIGINT or SIGTERM (0) or until the loop dies (1), then stop."""
        loop, wake = asyncio.get_running_loop(), asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, wake.set)
        await self.start()
        assert self._task is not None
        waiter = asyncio.create_task(wake.wait())
        await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        died = self._task.done() and not self._task.cancelled() and \
            self._task.exception() is not None
        if died:
            log.error("the logger's loop died: %r", self._task.exception())
        await self.stop()
        return 1 if died else 0

    def liveness(self) -> tuple[bool, dict[str, str]]:
        alive = self._task is not None and not self._task.done()
        return alive, {"loop": "running" if alive else "stopped"}

    def readiness(self) -> tuple[bool, dict[str, str]]:
        alive, details = self.liveness()
        sink = "ok" if not self.failures else f"{self.failures} writes failed in a row"
        return alive and not self.failures, details | {"sink": sink}

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._round()
            except SinkError as exc:
                await self._sink_failed(exc)
            except RedisUnavailableError as exc:
                log.warning("logger: Redis unavailable: %s", exc)
                await self.sleep(1.0)
            except RedisCommandError as exc:
                if exc.code != "NOGROUP":
                    raise  # refused for good: the process exits and is restarted
                log.warning("logger: the log group is missing (Redis flushed?): %s", exc)
                await self._regroup()

    async def _round(self) -> None:
        """Read, hand to the sink, acknowledge what it holds; the upkeep when due."""
        entries = await self._claim() + await self._read()
        records = [entry for entry in entries if entry.record]
        held = await self.sink.put(records) if records else []
        held += await self.sink.due()
        await self._ack([*held, *(entry for entry in entries if not entry.record)])
        if self.failures:
            log.info("logger: the sink takes records again")
        self.failures = 0
        self.metrics.sink_up.set(1)
        await self._measure()
        self.rounds += 1

    async def _sink_failed(self, exc: SinkError) -> None:
        """Forget what the sink did not hold; read it again after a backoff."""
        self.failures += 1
        self.metrics.failures.inc()
        self.metrics.sink_up.set(0)
        if self.failures == 1 or self.failures % 20 == 0:
            log.warning("logger: the sink failed (%d in a row): %s", self.failures, exc)
        await self.sink.discard()
        self._cursors = dict.fromkeys(self.streams, "0")
        with contextlib.suppress(RedisUnavailableError):  # the stream grows while it is down
            await self._measure()
        delay = backoff_delay(min(self.failures, 16), RETRY_BASE_S, self.retry_max_s,
                              random.random())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)

    async def _regroup(self) -> None:
        for stream in self.streams:
            await ensure_group(self.redis, stream, keys.LOG_GROUP)
        self._cursors = dict.fromkeys(self.streams, "0")

    # -- Redis ---------------------------------------------------------------------------------

    async def _read(self) -> list[Entry]:
        """New entries (or, after a failure or at start, this consumer's pending ones)."""
        read = ("XREADGROUP", "GROUP", keys.LOG_GROUP, self.consumer, "COUNT", READ_COUNT)
        streams = list(self.streams)
        if self.reader is None:  # streams in many slots: one read each, then a pause if idle
            reply: list[Any] = []
            for stream in streams:
                reply += await self.redis.execute(*read, "STREAMS", stream,
                                                  self._cursors[stream]) or []
        else:
            idle = all(self._cursors[s] == NEW for s in streams)
            block = ("BLOCK", BLOCK_MS) if idle else ()
            reply = await self.reader.execute(
                *read, *block, "STREAMS", *streams, *(self._cursors[s] for s in streams),
                timeout_s=self.reader.timeout_s + BLOCK_MS / 1000) or []
        entries = self._entries(reply)
        if not entries and self.reader is None:
            await self.sleep(POLL_S)
        return entries

    def _entries(self, reply: Sequence[Any]) -> list[Entry]:
        """The entries of a read; a stream read from its pending entries moves past them, or
        on to new ones once it has none left."""
        found: list[Entry] = []
        answered = set()
        for stream, items in reply:
            name = text(stream)
            answered.add(name)
            for entry_id, fields in items:
                found += self._entry(name, text(entry_id), fields)
            if self._cursors[name] != NEW:
                self._cursors[name] = text(items[-1][0]) if items else NEW
        for name in self.streams.keys() - answered:  # a read of pending ones found none
            if self._cursors[name] != NEW:
                self._cursors[name] = NEW
        return found

    def _entry(self, stream: str, entry_id: str, fields: Any) -> list[Entry]:
        """An entry; one deleted since it was delivered has no record (it is only
        acknowledged)."""
        values = dict(zip(fields[::2], fields[1::2], strict=True)) if fields else {}
        record = values.get(keys.LOG_FIELD.encode(), b"")
        return [Entry(self.streams[stream], entry_id, bytes(record))]

    async def _claim(self) -> list[Entry]:
        """Every ``CLAIM_EVERY_S``: entries a dead logger left pending."""
        now = time.monotonic()
        if now - self._last["claim"] < CLAIM_EVERY_S:
            return []
        self._last["claim"] = now
        found: list[Entry] = []
        for stream in self.streams:
            reply = await self.redis.execute("XAUTOCLAIM", stream, keys.LOG_GROUP, self.consumer,
                                             CLAIM_IDLE_MS, "0-0", "COUNT", READ_COUNT)
            for entry_id, fields in reply[1]:
                found += self._entry(stream, text(entry_id), fields)
        return found

    async def _ack(self, held: Sequence[Entry]) -> None:
        """Acknowledge and delete what the sink holds (and entries deleted already), by
        stream, in one round trip."""
        if not held:
            return
        by_stream: dict[str, list[str]] = {}
        for entry in held:
            by_stream.setdefault(keys.log_key(entry.model), []).append(entry.entry_id)
        commands = [command for stream, ids in by_stream.items() for command in (
            ("XACK", stream, keys.LOG_GROUP, *ids), ("XDEL", stream, *ids))]
        await self.redis.pipeline(commands)
        for entry in held:
            if entry.record:
                self.metrics.written.labels(entry.model).inc()

    async def _measure(self) -> None:
        now = time.monotonic()
        if now - self._last["measure"] < MEASURE_EVERY_S:
            return
        self._last["measure"] = now
        lengths = await self.redis.pipeline([("XLEN", stream) for stream in self.streams])
        for model, length in zip(self.streams.values(), lengths, strict=True):
            self.metrics.waiting.labels(model).set(int(length))

    async def _forget(self) -> None:
        """Leave the group's consumer list, unless entries are still pending here."""
        for stream in self.streams:
            pending = await self.redis.execute("XPENDING", stream, keys.LOG_GROUP, "-", "+", 1,
                                               self.consumer)
            if not pending:
                await self.redis.execute("XGROUP", "DELCONSUMER", stream, keys.LOG_GROUP,
                                         self.consumer)
