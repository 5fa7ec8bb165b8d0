"""Results as Redis hashes with a TTL; completion is announced on one pub/sub channel.

Long-polling clients do not poll Redis: each gateway process keeps one subscription to
``RESULT_CHANNEL`` and wakes exactly the waiters of the task ids it hears about.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from ferry import keys
from ferry.queue.base import DeadLetter
from ferry.redis_conn import text
from ferry.results.base import ResultRecord

log = logging.getLogger(__name__)

LISTEN_TICK_S = 0.25  # how often the listener looks up from the socket to see if it must stop

# Write a final record unless one is there already (at-least-once delivery may run a task twice;
# the first final answer stands), refresh the TTL, add the dead letter of a failure in the same
# step (so a retried write can neither lose nor repeat it), then announce the task id.
# KEYS: result hash, dead-letter stream. ARGV: ttl, channel, task id, dead-letter maxlen,
# n = number of hash items, n hash items (field, value, ...), then dead-letter items, if any.
_COMPLETE = """
local status = redis.call('HGET', KEYS[1], 'status')
if status and status ~= 'PENDING' then return 0 end
local n = tonumber(ARGV[5])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 6, 5 + n))
redis.call('EXPIRE', KEYS[1], ARGV[1])
if #ARGV > 5 + n then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', unpack(ARGV, 6 + n))
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""



def _flatten(fields: Mapping[str, bytes | str]) -> list[bytes | str]:
    return [item for pair in fields.items() for item in pair]


class RedisResultStore:
    """Task records in Redis; ``start_listener`` enables ``wait`` (gateways only)."""

    def __init__(self, redis: aioredis.Redis, ttl_s: int, dead_letter_maxlen: int = 100_000
                 ) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.dead_letter_maxlen = dead_letter_maxlen
        self._complete = redis.register_script(_COMPLETE)
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

    async def get(self, task_id: str) -> ResultRecord | None:
        raw = await self.redis.hgetall(keys.result_key(task_id))
        if not raw:
            return None
        return ResultRecord.from_fields(task_id, {text(k): text(v) for k, v in raw.items()})

    async def complete(self, records: Sequence[ResultRecord],
                       dead_letters: Mapping[str, DeadLetter] | None = None) -> list[bool]:
        """Write final records (one round trip); for each, whether it was new.

        ``dead_letters`` (by task id) go to the dead-letter stream with their record, only if the
        record is new. False means a final record was there already (a duplicate delivery ran the
        task again): nothing is written for it.
        """
        if not records:
            return []
        letters = dead_letters or {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for record in records:
                fields = _flatten(record.to_fields())
                letter = _flatten(letters.get(record.task_id, {}))
                args = [self.ttl_s, keys.RESULT_CHANNEL, record.task_id, self.dead_letter_maxlen,
                        len(fields), *fields, *letter]
                await self._complete(keys=[keys.result_key(record.task_id),
                                           keys.DEAD_LETTER_STREAM], args=args, client=pipe)
            written = await pipe.execute()
        return [bool(int(w)) for w in written]

    async def wait(self, task_id: str, timeout_s: float) -> ResultRecord | None:
        """The record once final, or as it stands after ``timeout_s``.

        The waiter is registered before the record is read, so a completion announced between the
        read and the wait is not missed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(task_id, set()).add(waiter)
            try:
                record = await self.get(task_id)
                remaining = deadline - loop.time()
                if record is None or record.status.final or remaining <= 0:
                    return record
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter, remaining)
            finally:
                self._discard(task_id, waiter)

    def _discard(self, task_id: str, waiter: asyncio.Future[None]) -> None:
        futures = self._waiters.get(task_id)
        if futures is not None:
            futures.discard(waiter)
            if not futures:
                del self._waiters[task_id]

    def _wake(self, task_id: str) -> None:
        for future in self._waiters.get(task_id, ()):
            if not future.done():
                future.set_result(None)

    def _wake_all(self) -> None:
        for task_id in list(self._waiters):
            self._wake(task_id)

    async def start_listener(self) -> None:
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="ferry-result-listener")

    async def stop_listener(self, timeout_s: float = 2.0) -> None:
        """Ask the listener to finish (it checks every ``LISTEN_TICK_S``); cancel if it won't."""
        if self._listener is not None:
            self._closing.set()
            done, _ = await asyncio.wait({self._listener}, timeout=timeout_s)
            if not done:
                self._listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._listener
            self._listener = None
        self._wake_all()

    async def _listen(self) -> None:
        """Subscribe, dispatch, and on any Redis error resubscribe (waking everyone to re-check)."""
        while not self._closing.is_set():
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(keys.RESULT_CHANNEL)
                    self._wake_all()  # anything finished while we were not subscribed
                    await self._dispatch(pubsub)
            except (RedisError, OSError) as exc:
                log.warning("result listener lost Redis (%s); resubscribing", exc)
                self._wake_all()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), 0.5)

    async def _dispatch(self, pubsub: PubSub) -> None:
        # A blocking read with a short timeout rather than cancellation of listen(): redis-py's
        # reader does not always honour a cancel, and a gateway must stop on time.
        while not self._closing.is_set():
            message = await pubsub.get_message(timeout=LISTEN_TICK_S)
            if message is not None and message.get("type") == "message":
                self._wake(text(message["data"]))
