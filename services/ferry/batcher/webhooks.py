"""Sending webhooks: a loop per batcher over its partitions' webhook streams.

The scripts that end a task (completion, cancel, a cache hit) queue ``task_id`` and ``url`` on
the task's partition's webhook stream in the same step, so a webhook is never lost: it is read
through a consumer group, POSTed (signed, redirects not followed, ``webhook_timeout_s`` each) and
retried with exponential backoff until it is answered 2xx or ``webhook_retry_s`` has passed. The
outcome is then written into the task's record (``"webhook": {...}``) in the step that
acknowledges the entry; a batcher that dies mid-way leaves the entry pending, for another to
claim and send again (a receiver may see a webhook twice, never none).

A bulk job's state changes are queued on one more stream, ``keys.JOB_WEBHOOKS``, with the job's
record as it was then (``body``); the batcher that owns partition 0 sends them, with a
``Ferry-Job`` header in place of ``Ferry-Task``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NamedTuple

import httpx
import orjson

from ferry import keys, lua
from ferry.backoff import backoff_delay
from ferry.errors import RedisCommandError, RedisUnavailableError
from ferry.redis_conn import ensure_group, field_map, text
from ferry.resp.client import Commands
from ferry.settings import BatcherSettings
from ferry.telemetry.metrics import BatcherMetrics
from ferry.webhooks import SIGNATURE_HEADER, CallbackRefusedError, pin, sign

log = logging.getLogger(__name__)
CONCURRENCY = 32
CLUSTER_POLL_S = 0.5  # on a Redis Cluster, how long to wait before reading empty streams again
CLAIM_EVERY_S = 30.0
BLOCK_MS = 1000  # a read waits this long for a webhook to send (on one Redis)
# Refusals that mean Redis lost the streams' data (the group is gone; the stream was deleted
# under a blocked read): the streams and the group are made again.
REGROUP = ("NOGROUP", "UNBLOCKED")


class DoneKeys(NamedTuple):
    task: str  # the task's hash
    stream: str  # its partition's webhook stream


class DoneArgs(NamedTuple):
    group: str
    entry_id: str
    outcome: bytes  # JSON: the record's "webhook"


class Done(IntEnum):
    """What ending a webhook did to its task's record (the entry goes either way)."""

    NOTED = 1  # the outcome joined the record
    SKIPPED = 0  # the record has expired, or holds an earlier outcome


DONE = lua.ScriptSpec("ferry.batcher", "webhook_done", DoneKeys._fields, DoneArgs._fields,
                      results=(Done, "DONE_"))


class WebhookSender:
    """Start, run, stop: sends the webhooks of ``owned`` partitions."""

    def __init__(self, settings: BatcherSettings, redis: Commands, owned: Sequence[int],
                 consumer: str, metrics: BatcherMetrics, *, reader: Commands | None = None
                 ) -> None:
        """``redis`` carries the commands (a client the batcher shares); ``reader`` the reads,
        which on one Redis block for up to a second and so need a connection of their own
        (None: ``redis``, whose reads then never block, as on a Redis Cluster)."""
        self.settings = settings
        self.redis = redis
        self.reader = reader
        self.owned = tuple(owned)
        self.streams: dict[str, int | None] = {keys.webhook_stream(p): p for p in self.owned}
        if 0 in self.owned:
            self.streams[keys.JOB_WEBHOOKS] = None
        self.consumer = consumer
        self.metrics = metrics
        self._done = redis.register_script(lua.source(DONE))
        self._client: httpx.AsyncClient | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        await self._ensure_groups()
        self._client = httpx.AsyncClient(follow_redirects=False,
                                         timeout=self.settings.webhook_timeout_s)
        self._loop_task = asyncio.create_task(self._run(), name="ferry-webhooks")

    async def _ensure_groups(self) -> None:
        """Create the consumer group on every webhook stream (and the stream) if missing."""
        for stream in self.streams:
            await ensure_group(self.redis, stream, keys.WEBHOOK_GROUP)

    async def stop(self) -> None:
        """Stop reading; cancel sends in progress (their entries stay pending, to be claimed)."""
        self._stopping.set()
        tasks = [t for t in (self._loop_task, *self._sending) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._client is not None:
            await self._client.aclose()
        if self.reader is not None:
            await self.reader.close()

    async def _run(self) -> None:
        pending = True  # first, what this consumer left unacknowledged (never: a new name)
        last_claim, regroup = 0.0, False
        while not self._stopping.is_set():
            try:
                if regroup:
                    await self._ensure_groups()
                    regroup = False
                if time.monotonic() - last_claim >= CLAIM_EVERY_S:
                    last_claim = time.monotonic()
                    await self._claim()
                await self._read(pending)
                pending = False
            except RedisUnavailableError as exc:
                log.warning("reading webhooks failed: %s", exc)
                await asyncio.sleep(1.0)
            except RedisCommandError as exc:
                if exc.code not in REGROUP:  # refused for good: said once, not tried forever
                    log.error("webhooks stopped: Redis refuses their reads (%s)", exc)
                    return
                log.warning("webhook group missing (Redis flushed?); recreating it: %s", exc)
                regroup = True

    async def _read(self, pending: bool) -> None:
        start = "0" if pending else ">"
        read = ("XREADGROUP", "GROUP", keys.WEBHOOK_GROUP, self.consumer, "COUNT", CONCURRENCY)
        if self.reader is None:  # streams in many slots: one read each, then a pause
            reply: Any = []
            for stream in self.streams:
                reply += await self.redis.execute(*read, "STREAMS", stream, start) or []
            if not reply and not pending:
                await asyncio.sleep(CLUSTER_POLL_S)
        else:
            block = () if pending else ("BLOCK", BLOCK_MS)
            reply = await self.reader.execute(
                *read, *block, "STREAMS", *self.streams, *(start for _ in self.streams),
                timeout_s=self.settings.redis_socket_timeout_s + BLOCK_MS / 1000)
        for stream, entries in reply or ():
            for entry_id, fields in entries:
                await self._start_send(text(stream), entry_id, fields)

    async def _claim(self) -> None:
        """Take over webhooks another batcher left (it died while sending)."""
        idle_ms = int((self.settings.webhook_retry_s + 60) * 1000)
        for stream in self.streams:
            reply: Any = await self.redis.execute("XAUTOCLAIM", stream, keys.WEBHOOK_GROUP,
                                                  self.consumer, idle_ms, "0-0", "COUNT",
                                                  CONCURRENCY)
            for entry_id, fields in reply[1]:
                if fields:
                    await self._start_send(stream, entry_id, fields)

    async def _start_send(self, stream: str, entry_id: Any, fields: Any) -> None:
        """Send an entry's webhook in a task of its own, once one of the slots is free."""
        await self._slots.acquire()
        task = asyncio.create_task(self._send(stream, text(entry_id), field_map(fields)))
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("sending a webhook failed: %r", task.exception())

    async def _send(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        partition = self.streams[stream]
        if partition is None:
            await self._send_job(stream, entry_id, fields)
            return
        task_id = text(fields.get(b"task_id", b""))
        url = text(fields.get(b"url", b""))
        key = keys.task_key(task_id, partition)
        body = await self.redis.execute("HGET", key, "body") if task_id else None
        if body is None or not url:  # the record expired meanwhile: nothing left to send
            await self._finish(key, stream, entry_id, {"status": "failed",
                                                       "error": "record expired"})
            return
        outcome = await self._post(url, ("Ferry-Task", task_id),
                                   body if isinstance(body, bytes) else body.encode())
        self.metrics.webhooks.labels(outcome["status"]).inc()
        await self._finish(key, stream, entry_id, outcome)

    async def _send_job(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """A job's state change: its record as it was, POSTed; the entry then goes."""
        job_id, url = text(fields.get(b"job_id", b"")), text(fields.get(b"url", b""))
        body = fields.get(b"body", b"")
        if job_id and url and body:
            outcome = await self._post(url, ("Ferry-Job", job_id), body)
            self.metrics.webhooks.labels(outcome["status"]).inc()
            if outcome["status"] != "delivered":
                log.warning("job %s: webhook to %s failed: %s", job_id, url, outcome)
        with contextlib.suppress(RedisUnavailableError):  # unacknowledged: sent again later
            await self.redis.pipeline([("XACK", stream, keys.WEBHOOK_GROUP, entry_id),
                                       ("XDEL", stream, entry_id)])

    async def _post(self, url: str, about: tuple[str, str], body: bytes) -> dict[str, Any]:
        """POST until a 2xx or the retry time is spent; what happened."""
        assert self._client is not None
        deadline = time.monotonic() + self.settings.webhook_retry_s
        attempt, last = 0, ""
        try:
            target = await pin(url, self.settings.webhook_allow_private)
        except CallbackRefusedError as exc:
            return {"status": "failed", "attempts": 0, "error": str(exc), "at": time.time()}
        while True:
            attempt += 1
            now = int(time.time())
            headers = {"Content-Type": "application/json", about[0]: about[1],
                       SIGNATURE_HEADER: sign(self.settings.webhook_secret, now, body),
                       **target.headers}
            status = 0
            try:
                answer = await self._client.post(target.url, content=body, headers=headers,
                                                 extensions=target.extensions)
                status = answer.status_code
                last = f"HTTP {status}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                return {"status": "delivered", "attempts": attempt, "http_status": status,
                        "at": time.time()}
            delay = backoff_delay(attempt, 0.5, 30.0, random.random())
            if time.monotonic() + delay > deadline:
                return {"status": "failed", "attempts": attempt, "error": last,
                        "at": time.time()}
            await asyncio.sleep(delay)

    async def _finish(self, key: str, stream: str, entry_id: str,
                      outcome: dict[str, Any]) -> None:
        with contextlib.suppress(RedisUnavailableError):  # unacknowledged: sent again later
            await self.redis.execute(*self._done.command(
                DoneKeys(task=key, stream=stream),
                DoneArgs(group=keys.WEBHOOK_GROUP, entry_id=entry_id,
                         outcome=orjson.dumps(outcome))))
