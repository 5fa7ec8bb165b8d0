"""One Redis connection in subscribe mode, kept open: every message goes straight to a callback.

Messages are handed over from ``data_received``, with no task or queue per message. After each
(re)subscription ``on_connect`` runs, so that a listener can re-check whatever it may have missed
while it was not subscribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import cast

import hiredis

from ferry.backoff import backoff_delay
from ferry.errors import RedisError, redis_reply_error
from ferry.resp.client import (
    Locate,
    RedisAddress,
    RespConnectionError,
    handshake,
    open_connection,
    pack,
)

log = logging.getLogger(__name__)


class _Subscription(asyncio.Protocol):
    def __init__(self, channel: bytes, on_message: Callable[[bytes], None]) -> None:
        self.channel = channel
        self.on_message = on_message
        self.reader = hiredis.Reader(replyError=redis_reply_error)
        self.transport: asyncio.Transport | None = None
        self.subscribed = asyncio.Event()
        self.lost = asyncio.Event()
        self.alive = True  # a PONG (or any reply) since the last ping
        self.error: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.alive = True
            if isinstance(reply, RedisError):
                self.error = reply  # AUTH or SUBSCRIBE refused: reconnecting will not help soon
                self.close()
            elif isinstance(reply, list) and reply and reply[0] == b"message":
                self.on_message(reply[2])
            elif isinstance(reply, list) and reply and reply[0] == b"subscribe":
                self.subscribed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()

    def send(self, *command: bytes | str) -> None:
        if self.transport is not None and not self.lost.is_set():
            self.transport.write(pack(command))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.lost.set()


class Subscriber:
    """Listens on one channel until stopped, resubscribing after any loss of the connection."""

    def __init__(self, address: RedisAddress, channel: str, on_message: Callable[[bytes], None],
                 on_connect: Callable[[], None], *, timeout_s: float = 10.0,
                 ping_interval_s: float = 5.0, name: str = "ferry-subscriber",
                 locate: Locate | None = None) -> None:
        self.address = address
        self.locate = locate  # with Sentinel: the master, found again at every connect
        self.channel = channel.encode()
        self.on_message = on_message
        self.on_connect = on_connect
        self.timeout_s = timeout_s
        self.ping_interval_s = ping_interval_s
        self.name = name
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._current: _Subscription | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="ferry-subscriber")

    async def stop(self) -> None:
        """Close the connection, which ends the session; cancel only if it does not end."""
        self._stopping.set()
        if self._current is not None:
            self._current.close()
        task, self._task = self._task, None
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=self.timeout_s)
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("result subscription ended with %r", task.exception())

    async def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                await self._session()
                failures = 0
            except (RespConnectionError, TimeoutError, OSError) as exc:
                failures += 1
                if not self._stopping.is_set():
                    log.warning("result subscription lost Redis (%s); resubscribing", exc)
            self.connected.clear()  # waiters keep waiting: they re-check once resubscribed
            if not self._stopping.is_set():
                await _wait(self._stopping,
                            backoff_delay(min(failures + 1, 8), 0.1, 2.0, jitter=1.0))

    async def _session(self) -> None:
        address = self.address if self.locate is None else await self.locate()
        sub = await open_connection(
            address, lambda: _Subscription(self.channel, self.on_message), self.timeout_s)
        self._current = sub
        try:
            if self._stopping.is_set():
                return
            for command in handshake(address, self.name, select=False):
                sub.send(*(str(a) if isinstance(a, int | float) else a for a in command))
            sub.send("SUBSCRIBE", self.channel)
            async with asyncio.timeout(self.timeout_s):
                await _first(sub.subscribed, sub.lost)
            if sub.lost.is_set():
                raise RespConnectionError(f"subscription refused or lost: {sub.error}")
            self.connected.set()
            self.on_connect()
            while not await _wait(sub.lost, self.ping_interval_s):
                if not sub.alive:
                    raise RespConnectionError(f"no answer to PING in {self.ping_interval_s:g} s")
                sub.alive = False
                sub.send("PING")
            if sub.error is not None:
                raise RespConnectionError(f"subscription refused: {sub.error}")
        finally:
            self._current = None
            sub.close()


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` was set within ``seconds`` (asyncio.timeout: safe to cancel)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def _first(*events: asyncio.Event) -> None:
    """Until any of ``events`` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
