"""Idempotent admission, a layer above the admission port: a request with an
``Idempotency-Key`` admits its task once; a repeat of it gets the first one's task (waiting for
its admission, or its end, as the first request would have), and a repeat with another request
is refused. The key and its Redis script are ``tasks.idempotency``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Protocol

from ferry.errors import (
    ClientError,
    DependencyUnavailableError,
    RedisError,
    RedisUnavailableError,
    ServiceUnavailableError,
    UnprocessableError,
)
from ferry.tasks import idempotency
from ferry.tasks.admission import Submitted
from ferry.tasks.idempotency import IdempotencyKeys
from ferry.tasks.record import StoredRecord
from ferry.tasks.waiters import Watch

WAIT_TRIES, WAIT_S = 20, 0.05  # a repeat waits for the first's admission
TAKEOVER_TRIES = 3  # a repeat takes over a key whose task never came to be
RELEASE_ON = (ClientError, DependencyUnavailableError, RedisError)  # not admitted


class Records(Protocol):
    """The task records a repeat reads (``GatewayStore``'s)."""

    async def read(self, task_id: str) -> StoredRecord | None: ...

    async def reconfirm(self, task_id: str) -> None: ...


class Watching(Protocol):
    """Waits for tasks' ends (``ResultWaiters``)."""

    def watch(self, task_id: str) -> AbstractContextManager[Watch]: ...


class Idempotent:
    """Admits a keyed request's task once: ``once`` runs ``admit`` for the first request of a
    key, and answers a repeat with the first one's task."""

    def __init__(self, keys: IdempotencyKeys, records: Records, waiters: Watching,
                 replayed: Callable[[], None] = lambda: None) -> None:
        self.keys = keys
        self.records = records
        self.waiters = waiters
        self.replayed = replayed

    async def once(self, key: str, task_id: str, digest: str, wait_s: float,
                   admit: Callable[[], Awaitable[Submitted]]) -> Submitted:
        """``admit`` the task ``task_id`` unless ``key`` (``idempotency.redis_key``) names
        another's; then that task (``digest``: what the request asks, to tell a repeat from a
        different request with the same key)."""
        replay = await self._take(key, task_id, digest, wait_s)
        if replay is not None:
            return replay
        try:
            submitted = await admit()
        except RELEASE_ON:
            with contextlib.suppress(Exception):  # best effort: a retry will find it stale
                await self.keys.release(key, task_id, digest)
            raise
        with contextlib.suppress(RedisUnavailableError):  # unconfirmed: still replayed
            await self.keys.confirm(key, task_id, digest)  # while its record lives
        return submitted

    async def _take(self, key: str, task_id: str, digest: str,
                    wait_s: float) -> Submitted | None:
        """Take the key for ``task_id`` (None: this request admits its task), or the answer of
        the first request that took it."""
        holder = await self.keys.claim(key, task_id, digest)
        for _ in range(TAKEOVER_TRIES):
            if holder is None:
                return None
            replay = await self._replay(holder, digest, wait_s)
            if replay is not None:
                return replay
            if await self.keys.replace(key, holder, task_id, digest):
                return None  # the first request's task never came to be: this one takes over
            holder = await self.keys.claim(key, task_id, digest)  # another one did
        raise ServiceUnavailableError("idempotency_contended", "concurrent repeats of this "
                                      "request keep replacing each other; retry", 1.0)

    async def _replay(self, holder: idempotency.Claimed, digest: str,
                      wait_s: float) -> Submitted | None:
        """The first request's task for a repeat; None if that task never came to be (its
        request failed before admission) and this request takes the key over."""
        if holder.digest != digest:
            raise UnprocessableError("idempotency_key_reused", "this Idempotency-Key was used "
                                     f"with a different request (task {holder.task_id}); a "
                                     "key stands for one request for 24 h")
        record = await self._first_record(holder)
        if record is None and holder.admitted:  # admitted, and its result has expired since
            self.replayed()
            return Submitted(holder.task_id, None, replayed=True)
        if record is None:
            return None
        if not holder.admitted:  # its first request may have failed before its WAIT did
            await self.records.reconfirm(holder.task_id)
        if wait_s > 0 and not record.status.final:
            with self.waiters.watch(holder.task_id) as watch:
                record = await watch.final(wait_s) or record
        self.replayed()
        return Submitted(holder.task_id, record if record.status.final and wait_s > 0 else None,
                         replayed=True)

    async def _first_record(self, holder: idempotency.Claimed) -> StoredRecord | None:
        """The first request's record, waiting a moment for it while it may be admitting."""
        record = await self.records.read(holder.task_id)
        for _ in range(0 if holder.admitted else WAIT_TRIES):
            if record is not None:
                break
            await asyncio.sleep(WAIT_S)
            record = await self.records.read(holder.task_id)
        return record
