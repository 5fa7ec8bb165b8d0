"""Time limits on reading a request: a client that stalls in its headers or its body is
answered 408 and its connection closed.

uvicorn itself has none (a request that declares ``Content-Length: 1000`` and sends 5 bytes
holds its connection, and whatever the route awaits, for ever), so the gateway runs its
httptools protocol with one timer per connection. The timer is armed only while a request is
partly read; a request that arrives whole in one read, as nearly every request to the hot
routes does, costs a few attribute checks and never touches it. When it fires it looks at what
has happened since and either re-arms for the time left or answers.

- headers: the request line and headers must all arrive within ``header_s`` of the request's
  first byte (a total, not a gap: a client sending a byte a second would never stall).
  A connection that sends nothing at all for ``header_s`` is closed without an answer.
- body: no gap between two reads of the body may exceed ``body_s``, so a large upload at any
  speed is never cut; time the gateway itself holds reading back (its buffer full while the
  route works, a pipelined request waiting its turn, ``Expect: 100-continue`` not yet
  answered) does not count.

The limits come from the app: its lifespan returns them as the state entry ``STATE_KEY``
(uvicorn hands the lifespan's state to every connection), so each worker takes them from its
own settings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

log = logging.getLogger(__name__)

STATE_KEY = "ferry.read_timeouts"
# Set in a request's scope when its body timed out: the route then sees the client gone, and
# tells this apart from a client that left by itself.
TIMED_OUT = "ferry.timed_out"
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
_IDLE = "idle"  # a connection that never sent a request


def _uncounted(kind: str) -> None:
    """No metrics to count in."""


@dataclass(frozen=True)
class ReadTimeouts:
    """How long a client may take to send its request's headers (in all) and its body (between
    two reads), and where a timeout is counted."""

    header_s: float
    body_s: float
    count: Callable[[str], None] = _uncounted

    def message(self, kind: str) -> str:
        """What the 408's body says happened."""
        if kind == HEADER_TIMEOUT:
            return (f"the request line and headers did not all arrive within {self.header_s:g} "
                    "s; the connection is closed")
        return (f"no part of the request body arrived for {self.body_s:g} s; the connection is "
                "closed")


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the read timeouts of the app's ``ReadTimeouts``."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits: ReadTimeouts | None = app_state.get(STATE_KEY)
        self.timer: asyncio.TimerHandle | None = None
        self.head_scope: object = None  # the request whose headers head_started dates
        self.head_started = 0.0
        self.last_read = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.limits is not None:
            self.timer = self.loop.call_later(self.limits.header_s, self._expire)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if self.limits is None:
            return
        if cycle is not None and cycle.scope is self.scope:  # the latest request's body
            if cycle.more_body:
                self.last_read = self.loop.time()
                self._arm(self.limits.body_s)
        elif self.scope is not None:  # a request whose headers are not all in
            if self.head_scope is not self.scope:
                self.head_scope, self.head_started = self.scope, self.loop.time()
            self._arm(self.limits.header_s)

    def _arm(self, delay: float) -> None:
        if self.timer is None:
            self.timer = self.loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self.limits is None or self.transport.is_closing():
            return
        kind, left = self._pending(self.limits, self.loop.time())
        if kind is None:
            return
        if left > 0:
            self.timer = self.loop.call_later(left, self._expire)
        else:
            self._time_out(self.limits, kind)

    def _pending(self, limits: ReadTimeouts, now: float) -> tuple[str | None, float]:
        """What is being read (None: nothing, the timer is not needed) and how long is left."""
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            if not cycle.more_body:
                return None, 0.0
            if self.flow.read_paused or cycle.waiting_for_100_continue:
                self.last_read = now  # the gateway holds the body back, not the client
            return BODY_TIMEOUT, self.last_read + limits.body_s - now
        if self.scope is not None:
            return HEADER_TIMEOUT, self.head_started + limits.header_s - now
        return _IDLE, 0.0

    def _time_out(self, limits: ReadTimeouts, kind: str) -> None:
        """Answer 408 if the request has no answer yet and the connection is free to carry one;
        close the connection in any case."""
        cycle = self.cycle
        current = cycle if cycle is not None and cycle.scope is self.scope else None
        if kind == HEADER_TIMEOUT:
            free = cycle is None or cycle.response_complete
        else:
            free = current is not None and not current.response_started
        if free and kind != _IDLE:
            self._write_408(kind, limits.message(kind))
            if current is None:
                limits.count(kind)  # no route saw it: counted here
        if current is not None and not current.response_complete:
            current.scope[TIMED_OUT] = kind  # type: ignore[literal-required]
            current.disconnected = True  # whatever the route answers now goes nowhere
            current.message_event.set()
        log.debug("closing a connection from %s: %s", self.client, kind)
        self.transport.close()

    def _write_408(self, code: str, message: str) -> None:
        body = orjson.dumps({"error": {"code": code, "message": message}})
        content = [STATUS_LINE[408]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.append(b"content-type: application/json\r\ncontent-length: %d\r\n"
                       b"connection: close\r\n\r\n" % len(body))
        content.append(body)
        self.transport.write(b"".join(content))
