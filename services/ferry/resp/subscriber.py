"""One Redis connection in subscribe mode, kept open: every message goes straight to a callback.

Messages are handed over from ``data_received``, with no task or queue per message. Channels can
be added and dropped while it runs (``subscribe`` answers once Redis has confirmed). After each
(re)subscription to all of them ``on_connect`` runs, so that a listener can re-check whatever it
may have missed while it was not subscribed.

Sharded (Redis 7's ``SSUBSCRIBE``, for a Redis Cluster), its channels all hash to one slot and
it listens on the node that owns it (``locate``): a ``SPUBLISH`` there reaches it without a hop
over the cluster bus. When the slot moves, Redis ends the subscription, and it subscribes again
wherever ``locate`` then finds the slot; it also subscribes again when ``where`` (the slot's
owner as the cluster client knows it now, looked at every ping) names another node, as after a
manual failover, where Redis ends no subscription. A Redis without sharded Pub/Sub (before 7.0)
refuses ``SSUBSCRIBE``: that is logged once, and the subscriber stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
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


class _Unsupported(Exception):
    """This Redis does not know the subscribe command (SSUBSCRIBE before Redis 7.0)."""


_MESSAGES = (b"message", b"smessage")
_CONFIRMATIONS = (b"subscribe", b"ssubscribe")


class _Subscription(asyncio.Protocol):
    def __init__(self, on_message: Callable[[bytes], None],
                 on_subscribed: Callable[[bytes], None],
                 on_dropped: Callable[[bytes], None]) -> None:
        self.on_message = on_message
        self.on_subscribed = on_subscribed
        self.on_dropped = on_dropped
        self.reader = hiredis.Reader(replyError=redis_reply_error)
        self.transport: asyncio.Transport | None = None
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
            elif isinstance(reply, list) and reply:
                kind = reply[0]
                if kind in _MESSAGES:
                    self.on_message(reply[2])
                elif kind in _CONFIRMATIONS:
                    self.on_subscribed(reply[1])
                elif kind == b"sunsubscribe":
                    self.on_dropped(reply[1])

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
    """Listens on a set of channels until stopped, resubscribing after any loss of the
    connection."""

    def __init__(self, address: RedisAddress, channel: str | Iterable[str],  # noqa: PLR0913 - connection options, defaulted
                 on_message: Callable[[bytes], None], on_connect: Callable[[], None], *,
                 timeout_s: float = 10.0, ping_interval_s: float = 5.0,
                 name: str = "ferry-subscriber", locate: Locate | None = None,
                 sharded: bool = False,
                 where: Callable[[], Awaitable[RedisAddress]] | None = None) -> None:
        self.address = address
        # with Sentinel: the master, found again at every connect; sharded: the slot's owner
        self.locate = locate
        self.sharded = sharded
        self.where = where  # where it should be now, without asking Redis (None: not checked)
        self._verbs = ("SSUBSCRIBE", "SUNSUBSCRIBE") if sharded else ("SUBSCRIBE", "UNSUBSCRIBE")
        names = [channel] if isinstance(channel, str) else list(channel)
        self.channels: set[bytes] = {name.encode() for name in names}
        self.on_message = on_message
        self.on_connect = on_connect
        self.timeout_s = timeout_s
        self.ping_interval_s = ping_interval_s
        self.name = name
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._current: _Subscription | None = None  # the connection, once its handshake is sent
        self._asked: dict[bytes, int] = {}  # SUBSCRIBEs sent on it and not yet confirmed
        self._confirmed: set[bytes] = set()  # by Redis, on it
        self._confirming: dict[bytes, asyncio.Future[None]] = {}
        self._all_confirmed = asyncio.Event()  # every channel asked at connect
        self._dropping: dict[bytes, int] = {}  # SUNSUBSCRIBEs sent on it, not yet confirmed
        self.connected = asyncio.Event()

    def subscribe(self, channel: str) -> asyncio.Future[None] | None:
        """Listen on ``channel`` too: None if that is confirmed already, else a future done
        once Redis has confirmed it (or at once while there is no connection: ``on_connect``
        follows the next subscription to every channel)."""
        name = channel.encode()
        self.channels.add(name)
        if name in self._confirmed:
            return None
        confirming = self._confirming.get(name)
        if confirming is None:
            confirming = asyncio.get_running_loop().create_future()
            if self._current is None:
                confirming.set_result(None)
                return confirming
            self._confirming[name] = confirming
            self._ask(name)
        return confirming

    def unsubscribe(self, channel: str) -> None:
        """Stop listening on ``channel``."""
        name = channel.encode()
        self.channels.discard(name)
        self._confirmed.discard(name)
        if (confirming := self._confirming.pop(name, None)) is not None:
            confirming.set_result(None)
        if self._current is not None:
            if self.sharded:  # its confirmation is not a slot that moved
                self._dropping[name] = self._dropping.get(name, 0) + 1
            self._current.send(self._verbs[1], name)

    def _ask(self, *names: bytes) -> None:
        assert self._current is not None
        if not names:
            self._all_confirmed.set()
            return
        for name in names:
            self._asked[name] = self._asked.get(name, 0) + 1
        self._current.send(self._verbs[0], *names)

    def _subscribed(self, name: bytes) -> None:
        """Redis confirmed a SUBSCRIBE: the channel is live once its last one is confirmed
        (an UNSUBSCRIBE and a SUBSCRIBE again may be on their way)."""
        left = self._asked.get(name, 1) - 1
        if left > 0:
            self._asked[name] = left
            return
        self._asked.pop(name, None)
        if name in self.channels:
            self._confirmed.add(name)
        if (confirming := self._confirming.pop(name, None)) is not None:
            confirming.set_result(None)
        if self.channels <= self._confirmed:
            self._all_confirmed.set()

    def _dropped(self, name: bytes) -> None:
        """Redis ended a sharded subscription this side did not drop: its slot moved. A new
        connection finds the slot's owner and subscribes there."""
        if (left := self._dropping.pop(name, 0)) > 0:  # the confirmation of our own
            if left > 1:
                self._dropping[name] = left - 1
            return
        if name in self.channels and self._current is not None:
            log.info("the slot of %s moved; subscribing again where it is now", name.decode())
            self._current.close()

    def _forget(self) -> None:
        """The connection is gone: nothing is confirmed, and nobody waits for it."""
        self._current = None
        self._asked.clear()
        self._confirmed.clear()
        self._dropping.clear()
        self._all_confirmed.clear()
        confirming, self._confirming = self._confirming, {}
        for future in confirming.values():
            if not future.done():
                future.set_result(None)

    async def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="ferry-subscriber")

    @property
    def running(self) -> bool:
        """Whether its loop runs (it ends only when stopped, or refused for good)."""
        return self._task is not None and not self._task.done()

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
            except _Unsupported as exc:
                log.error("result subscription refused for good (%s): waits end at their wait "
                          "time without an early wake-up", exc)
                return
            except Exception as exc:  # any failure (a slot map that cannot be had, too) is
                failures += 1  # retried: a subscriber must not end by itself
                if not self._stopping.is_set():
                    log.warning("result subscription lost Redis (%s); resubscribing", exc)
            self.connected.clear()  # waiters keep waiting: they re-check once resubscribed
            if not self._stopping.is_set():
                await _wait(self._stopping,
                            backoff_delay(min(failures + 1, 8), 0.1, 2.0, jitter=1.0))

    async def _session(self) -> None:
        address = self.address if self.locate is None else await self.locate()
        sub = await open_connection(
            address, lambda: _Subscription(self.on_message, self._subscribed, self._dropped),
            self.timeout_s)
        try:
            if self._stopping.is_set():
                return
            for command in handshake(address, self.name, select=False):
                sub.send(*(str(a) if isinstance(a, int | float) else a for a in command))
            self._forget()
            self._current = sub
            self._ask(*sorted(self.channels))
            async with asyncio.timeout(self.timeout_s):
                await _first(self._all_confirmed, sub.lost)
            if sub.lost.is_set():
                if "unknown command" in str(sub.error).lower():
                    raise _Unsupported(str(sub.error))
                raise RespConnectionError(
                    "subscription refused or lost: "
                    + (str(sub.error) if sub.error is not None else
                       "the server closed the connection before confirming it (on rediss://, "
                       "the server may want a client certificate: FERRY_REDIS_CERT_FILE)"))
            self.connected.set()
            self.on_connect()
            while not await _wait(sub.lost, self.ping_interval_s):
                if not sub.alive:
                    raise RespConnectionError(f"no answer to PING in {self.ping_interval_s:g} s")
                if await self._elsewhere(address):
                    return  # subscribed again where it should be, at once
                sub.alive = False
                sub.send("PING")
            if sub.error is not None:
                raise RespConnectionError(f"subscription refused: {sub.error}")
        finally:
            self._forget()
            sub.close()


    async def _elsewhere(self, address: RedisAddress) -> bool:
        """Whether ``where`` names another node than ``address`` (a failed look: no)."""
        if self.where is None:
            return False
        try:
            now = await self.where()
        except Exception:  # the slot map could not be had: stay
            return False
        if (now.host, now.port) == (address.host, address.port):
            return False
        log.info("subscribed at %s:%s, where %s:%s now serves; moving", address.host,
                 address.port, now.host, now.port)
        return True


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
