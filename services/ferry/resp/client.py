"""A lean, pipelined Redis client for Ferry's hot path (asyncio Protocol + hiredis).

redis-py spends 35-55 µs of CPU per command on this path (pool checkout, retries, timeouts, a
StreamReader); this client spends under 10. One connection carries every concurrent caller's
commands in order (Redis answers in order, so no pool is needed), a command's timeout is checked by
one timer per connection, and a broken or timed-out connection fails what it carries and is
replaced on the next call. Blocking commands (``XREADGROUP BLOCK``) need a client of their own.
redis-py remains Ferry's client for everything off the hot path.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import hiredis

from ferry.errors import (
    RedisCommandError,
    RedisConnectionError,
    RedisError,
    RedisUnavailableError,
    redis_reply_error,
)
from ferry.settings.redis import RedisAddress

# Where Redis is (``RedisAddress``) is the settings' value, parsed from ``redis_url`` when they
# are built (they import no feature): named here too, where every connection takes it.
__all__ = ["HOLD_DOWN_S", "RECHECK_S", "Arg", "Command", "Commands", "Locate", "Packed",
           "RedisAddress", "RespClient", "RespConnectionError", "RespTimeoutError", "Script",
           "as_bytes", "handshake", "open_connection", "pack", "raise_first"]

log = logging.getLogger(__name__)
HOLD_DOWN_S = 0.5  # after a failed connection attempt, how long callers fail without retrying
RECHECK_S = 0.5  # with Sentinel: how often a live connection's master is checked with them
Arg = bytes | str | int | float
Command = Sequence[Arg]  # or a Packed command, sent as it is
Locate = Callable[[], Awaitable[RedisAddress]]  # where the master is now (Redis Sentinel)


# Errors are Ferry's (``ferry.errors``): an error reply is made by ``redis_reply_error`` as it is
# parsed (transient or permanent, decided there for both clients), a failed connection is a
# RespConnectionError.


class RespConnectionError(RedisConnectionError, ConnectionError):
    """Redis cannot be reached, or the connection broke: the command's effect is unknown."""


class RespTimeoutError(RespConnectionError, TimeoutError):
    """Redis did not answer within the command's timeout; the connection was dropped."""


def as_bytes(arg: Arg) -> bytes:
    """An argument as Redis receives it."""
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int):
        return b"%d" % arg
    return repr(arg).encode()


def pack(command: Command) -> bytes:
    """One command in RESP: an array of bulk strings (payloads are copied once, by the join)."""
    parts = [b"*%d\r\n" % len(command)]
    for arg in command:  # as_bytes, inlined: the hot path packs every argument of every command
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        else:
            data = as_bytes(arg)
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


class Packed(bytes):
    """A command packed in advance (sent as it is): for commands repeated with the same args.

    ``key`` names the key it works on, for a Redis Cluster client to route it (None: any node).
    """

    key: bytes | None = None

    @classmethod
    def of(cls, command: Command, key: Arg | None = None) -> Packed:
        packed = cls(pack(command))
        if key is not None:
            packed.key = as_bytes(key)
        return packed


class _Connection(asyncio.Protocol):
    """One socket; replies resolve waiting futures in the order the commands were sent."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._reader = hiredis.Reader(replyError=redis_reply_error)
        self._waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future[None] | None = None
        self.closed: Exception | None = None
        self.client_id: int | None = None  # Redis's id of this connection, once set up
        self.address: RedisAddress | None = None  # where it was opened to

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            if not self._waiting:
                self._fail(RespConnectionError("Redis sent a reply nobody asked for"))
                return
            future, _ = self._waiting.popleft()
            if isinstance(reply, RedisError):
                self._error(reply)
                if not future.done():  # a caller that gave up (cancelled) no longer wants it
                    future.set_exception(reply)
            elif not future.done():
                future.set_result(reply)

    def _error(self, reply: RedisError) -> None:
        """``READONLY`` (this server was demoted to a replica in a failover) retires the
        connection, so the next command finds the master again."""
        if reply.code == "READONLY":
            self.retire(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RespConnectionError(f"connection to Redis lost: {exc or 'closed by peer'}"))

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            if not self._writable.done():
                self._writable.set_result(None)
            self._writable = None

    # -- commands -------------------------------------------------------------------------------

    def send(self, commands: Sequence[Command], timeout_s: float | None = None
             ) -> list[asyncio.Future[Any]]:
        """Write ``commands`` at once; a future for each reply."""
        if self.closed is not None or self._transport is None:
            raise RespConnectionError(f"Redis connection is closed: {self.closed}")
        deadline = self._loop.time() + (timeout_s or self._timeout_s)
        futures = [self._loop.create_future() for _ in commands]
        self._waiting.extend((f, deadline) for f in futures)
        self._transport.write(b"".join(c if isinstance(c, Packed) else pack(c) for c in commands))
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._check_deadline)
        return futures

    async def writable(self) -> None:
        """Wait while the socket's send buffer is full (a slow Redis pushes back on callers)."""
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def _check_deadline(self) -> None:
        """Only the oldest command can be late: replies come in order."""
        self._timer = None
        if not self._waiting:
            return
        deadline = self._waiting[0][1]
        if self._loop.time() >= deadline:
            self._fail(RespTimeoutError(f"Redis did not answer within {self._timeout_s:g} s"))
            return
        self._timer = self._loop.call_at(deadline, self._check_deadline)

    def _fail(self, exc: Exception) -> None:
        if self.closed is None:
            self.closed = exc
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiting:
            future, _ = self._waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        self.resume_writing()
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._fail(RespConnectionError("client closed"))

    def retire(self, reason: Exception) -> None:
        """No new command here; the ones in flight fail (their effect unknown)."""
        if self.closed is None:
            self.closed = reason
            self._loop.call_soon(self._fail, reason)


class RespClient:
    """Commands over one lazily (re)opened connection; safe to share between coroutines."""

    def __init__(self, address: RedisAddress, *, timeout_s: float = 10.0,
                 connect_timeout_s: float = 10.0, name: str = "ferry",
                 locate: Locate | None = None) -> None:
        self.address = address
        self.locate = locate  # with Sentinel: asked for the master's address at every connect
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.name = name
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        self._failed: tuple[float, BaseException] | None = None  # last failed attempt
        self._scripts: dict[bytes, bytes] = {}  # sha1 -> source, loaded on every connect
        self._checked_at = 0.0  # with Sentinel: when the master was last asked of them
        self._checking: asyncio.Task[None] | None = None

    async def execute(self, *command: Arg, timeout_s: float | None = None) -> Any:
        """One command's reply (a lone ``Packed`` argument is sent as it is); an error reply
        raises it (a ``RedisError``)."""
        single = command[0] if len(command) == 1 and isinstance(command[0], Packed) else command
        return (await self._run([single], timeout_s))[0]

    async def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """Every command's reply, in order, in one round trip; raises the first error reply."""
        return await self._run(commands, None) if commands else []

    def register_script(self, source: str) -> Script:
        """A Lua script, loaded into Redis on every (re)connect and run with EVALSHA."""
        script = Script(source)
        self._scripts[script.sha] = source.encode()
        return script

    async def _run(self, commands: Sequence[Command], timeout_s: float | None) -> list[Any]:
        replies = await self._send(commands, timeout_s)
        for reply in replies:  # a plain loop: this runs for every command on the hot path
            if isinstance(reply, BaseException):
                if any(_no_script(r) for r in replies):
                    replies = await self._reloaded(commands, replies, timeout_s)
                raise_first(replies)
                return replies  # every NOSCRIPT reply was run again, and succeeded
        return replies

    async def replies(self, commands: Sequence[Command], timeout_s: float | None = None
                      ) -> list[Any]:
        """Every command's reply in order, an error reply (or a broken connection) as its
        exception instead of raising it; raises only if no connection can be had."""
        replies = await self._send(commands, timeout_s)
        if any(_no_script(r) for r in replies):
            replies = await self._reloaded(commands, replies, timeout_s)
        return replies

    async def _reloaded(self, commands: Sequence[Command], replies: list[Any],
                        timeout_s: float | None) -> list[Any]:
        """The script cache was flushed under a live connection: reload every script and run
        again the commands that found theirs missing."""
        missing = [i for i, r in enumerate(replies) if _no_script(r)]
        reloads: list[Command] = [("SCRIPT", "LOAD", s) for s in self._scripts.values()]
        again = await self._send([*reloads, *(commands[i] for i in missing)], timeout_s)
        for i, reply in zip(missing, again[len(reloads):], strict=True):
            replies[i] = reply
        return replies

    @property
    def live(self) -> object | None:
        """The live connection, as an identity to compare (None: none now)."""
        connection = self._connection
        return connection if connection is not None and connection.closed is None else None

    async def execute_traced(self, *command: Arg, timeout_s: float | None = None
                             ) -> tuple[Any, object | None]:
        """One command's reply and the connection that carried it (for a WAIT that must cover
        it: it covers that connection's writes only); an error reply raises. A command whose
        script was flushed is run again as ``execute`` runs it, on no known connection."""
        connection = await self._connected()
        future = connection.send([command], timeout_s)[0]
        await connection.writable()
        try:
            return await future, connection
        except RedisCommandError as exc:
            if not _no_script(exc):
                raise
        return await self.execute(*command, timeout_s=timeout_s), None

    @property
    def connection_id(self) -> int | None:
        """Redis's id of the live connection (for CLIENT UNBLOCK), or None if there is none."""
        connection = self._connection
        return connection.client_id if connection is not None and connection.closed is None \
            else None

    async def _send(self, commands: Sequence[Command], timeout_s: float | None) -> list[Any]:
        connection = await self._connected()
        futures = connection.send(commands, timeout_s)
        await connection.writable()
        if len(futures) == 1:
            try:
                return [await futures[0]]
            except RedisError as exc:
                return [exc]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    async def close(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def _connected(self) -> _Connection:
        """The live connection, or one attempt to open it shared by every caller waiting for it.

        After a failed attempt, callers fail at once for ``HOLD_DOWN_S`` instead of each making
        its own attempt, so an unreachable Redis answers everyone quickly.
        """
        connection = self._connection
        if connection is not None and connection.closed is None:
            if self.locate is not None:
                self._recheck(connection)
            return connection
        loop = asyncio.get_running_loop()
        if self._failed is not None and loop.time() - self._failed[0] < HOLD_DOWN_S:
            raise RespConnectionError(f"Redis is unreachable: {self._failed[1]}")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
            self._connecting.add_done_callback(self._attempt_done)
        attempt = self._connecting
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not attempt.cancelled() or (task is not None and task.cancelling()):
                raise  # this caller was cancelled
            # the attempt was given up under it (``close``: a Redis Cluster node that left
            # the slot map): a connection error for the caller, never a cancellation
            raise RespConnectionError(f"the connection to Redis at {self.address} was "
                                      "closed while it was being opened") from None

    def recheck_soon(self) -> None:
        """Ask the sentinels again at the next command (a WAIT was not satisfied: is this
        still the master?)."""
        self._checked_at = 0.0

    def _recheck(self, connection: _Connection) -> None:
        """Every ``RECHECK_S``, in the background: if the sentinels name another master, retire
        the connection. A master that was paused past its failover wakes up still a master,
        with no replicas, until the sentinels demote it; what it takes meanwhile is lost."""
        now = time.monotonic()
        if now - self._checked_at < RECHECK_S or self._checking is not None:
            return
        self._checked_at = now
        self._checking = asyncio.ensure_future(self._compare(connection))
        self._checking.add_done_callback(self._checked)

    async def _compare(self, connection: _Connection) -> None:
        assert self.locate is not None
        named = await self.locate()
        opened = connection.address
        if opened is not None and (named.host, named.port) != (opened.host, opened.port):
            connection.retire(RespConnectionError(
                f"the sentinels name {named} as the master now, not {opened}"))

    def _checked(self, check: asyncio.Task[None]) -> None:
        self._checking = None
        if not check.cancelled() and check.exception() is not None:
            log.debug("asking the sentinels for the master failed: %s", check.exception())

    def _attempt_done(self, attempt: asyncio.Future[_Connection]) -> None:
        self._connecting = None
        if attempt.cancelled():
            return
        error = attempt.exception()
        if error is None:
            self._connection, self._failed = attempt.result(), None
        else:
            self._failed = (asyncio.get_running_loop().time(), error)

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        address = self.address if self.locate is None else await self.locate()
        connection = await open_connection(
            address, lambda: _Connection(loop, self.timeout_s), self.connect_timeout_s)
        try:
            greeting = handshake(address, self.name)
            setup = [*greeting, ("CLIENT", "ID"),
                     *(("SCRIPT", "LOAD", source) for source in self._scripts.values())]
            if self.locate is not None:
                setup.append(("ROLE",))
            replies = await asyncio.gather(*connection.send(setup), return_exceptions=True)
            raise_first(replies)
            connection.client_id = int(cast(int, replies[len(greeting)]))
            connection.address = address
            if self.locate is not None and not _is_master(replies[-1]):
                raise RedisUnavailableError(f"Redis at {address} is not the master (yet): the "
                                            "sentinels have not seen the failover through")
        except RedisUnavailableError:  # not now (loading...), or the connection failed
            connection.close()
            raise
        except RedisError as exc:  # AUTH refused, no such database, too many clients...
            connection.close()
            raise RespConnectionError(f"Redis refused the connection's set-up: {exc}") from exc
        except BaseException:
            connection.close()
            raise
        return connection


P = TypeVar("P", bound=asyncio.Protocol)


async def open_connection(address: RedisAddress, factory: Callable[[], P],
                          timeout_s: float) -> P:
    """A connected protocol instance, or ``RespConnectionError``."""
    loop = asyncio.get_running_loop()
    context = address.ssl_context or (ssl.create_default_context() if address.tls else None)
    try:
        async with asyncio.timeout(timeout_s):  # unlike wait_for, never swallows a cancel
            if address.path is not None:
                _, protocol = await loop.create_unix_connection(factory, address.path)
            else:
                _, protocol = await loop.create_connection(factory, address.host, address.port,
                                                           ssl=context)
    except (OSError, TimeoutError) as exc:
        raise RespConnectionError(f"cannot connect to Redis at {address}: "
                                  f"{exc or type(exc).__name__}") from exc
    return protocol


def handshake(address: RedisAddress, name: str, *, select: bool = True) -> list[Command]:
    """Authenticate, choose the database, and name the connection (seen in CLIENT LIST)."""
    commands: list[Command] = []
    if address.password is not None:
        commands.append(("AUTH", address.username, address.password) if address.username
                        else ("AUTH", address.password))
    if address.db and select:
        commands.append(("SELECT", address.db))
    commands.append(("CLIENT", "SETNAME", name))
    return commands


def _is_master(role: Any) -> bool:
    """Whether a ``ROLE`` reply is a master's."""
    return bool(role) and role[0] == b"master"


def raise_first(replies: Sequence[Any]) -> None:
    """Raise the first error among ``replies`` (errors held as values), if any."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply


def _no_script(reply: Any) -> bool:
    return isinstance(reply, RedisCommandError) and reply.code == "NOSCRIPT"


class Script:
    """A Lua script known to a client; ``command`` is its EVALSHA, for ``execute`` or a pipeline."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest().encode()

    def command(self, keys: Sequence[Arg], args: Sequence[Arg]) -> Command:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


class Commands(Protocol):
    """What Ferry's hot path needs of a Redis client: ``RespClient`` for one server,
    ``ClusterClient`` for a Redis Cluster."""

    timeout_s: float

    async def execute(self, *command: Arg, timeout_s: float | None = None) -> Any: ...

    async def pipeline(self, commands: Sequence[Command]) -> list[Any]: ...

    async def replies(self, commands: Sequence[Command], timeout_s: float | None = None
                      ) -> list[Any]: ...

    def register_script(self, source: str) -> Script: ...

    async def close(self) -> None: ...
