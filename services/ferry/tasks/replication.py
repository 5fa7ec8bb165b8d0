"""Replica-acknowledged writes: ``WAIT`` for the admissions of a round, shared by all of them.

Redis replicates asynchronously: a master that answered an admission and died before a replica
received it takes the task with it. ``WAIT n ms`` blocks the connection that sent it until ``n``
replicas have acknowledged every write that connection made before it (or ``ms`` pass), and
answers how many did. Ferry's hot path sends every caller's commands over one connection (per
Redis Cluster node), so one ``WAIT`` covers every admission answered on it before it was sent: the
admissions that end while one ``WAIT`` is out share the next (a group commit). At most one
``WAIT`` per connection is out at a time, so a missing replica costs its commands one wait, not
one per turn of the event loop.

An admission is written on a known connection (``write``) and confirmed only by a ``WAIT`` sent
on that same connection: a connection that broke or was replaced in between (a failover, a slot
that moved) confirms nothing of it.

What it guarantees (as Redis's documentation says of WAIT): an admission confirmed by ``n``
replicas survives the failover of its master to one of them, which Sentinel and Redis Cluster
prefer (the most up-to-date replica is promoted). It does not make Redis strongly consistent: a
write can reach the replicas and still be answered as unconfirmed (a timeout), which is why an
unconfirmed admission is withdrawn, not left to chance.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import RedisCommandError, RedisUnavailableError
from ferry.resp.client import Command, Commands, RespClient
from ferry.resp.cluster import ClusterClient, redirect

log = logging.getLogger(__name__)


@dataclass
class _Round:
    """The callers one WAIT confirms: their writes were answered on ``connection``."""

    future: asyncio.Future[int]
    connection: object
    waiting: int = field(default=0)


@dataclass(frozen=True)
class Written:
    """A write's reply, and where it was made: the node's client and its connection."""

    reply: Any
    target: RespClient
    connection: object | None


class ReplicaAcks:
    """Writes whose replicas are counted, and the counting, per connection."""

    def __init__(self, client: Commands, replicas: int, wait_ms: int) -> None:
        self.client = client
        self.replicas = replicas
        self.wait_ms = wait_ms
        self._open: dict[RespClient, _Round] = {}  # the next WAIT's callers, per connection
        self._out: dict[RespClient, asyncio.Future[None]] = {}  # the WAIT out now

    async def write(self, key: str, command: Command) -> Written:
        """Send ``command`` (on ``key``) on the connection that serves the key's slot now."""
        target = await self._connection_of(key)
        try:
            reply, connection = await target.execute_traced(*command)
        except RedisCommandError as exc:
            if redirect(exc) is None or not isinstance(self.client, ClusterClient):
                raise
            self.client.slots_moved()  # the slot moved: it had no effect; try again
            raise RedisUnavailableError(f"the partition's slot moved ({exc})") from exc
        return Written(reply, target, connection)

    async def confirmed(self, written: Written) -> bool:
        """Whether ``replicas`` replicas have ``written``, within ``wait_ms``."""
        target, connection = written.target, written.connection
        if connection is None or target.live is not connection:
            return False
        now = self._open.get(target)
        if now is None or now.connection is not connection:
            if now is not None and not now.future.done():
                now.future.set_result(0)  # an older connection's round: nothing to confirm
            now = _Round(asyncio.get_running_loop().create_future(), connection)
            self._open[target] = now
            if target not in self._out:
                asyncio.get_running_loop().call_soon(self._send, target)
        now.waiting += 1
        return await asyncio.shield(now.future) >= self.replicas

    async def _connection_of(self, key: str) -> RespClient:
        if isinstance(self.client, ClusterClient):
            return await self.client.node_of(key)
        assert isinstance(self.client, RespClient), "a lean client has one connection or a node's"
        return self.client

    def _send(self, target: RespClient) -> None:
        """Send the open round's WAIT, unless one is out already (it is sent when that ends)."""
        if target in self._out or target not in self._open:
            return
        now = self._open.pop(target)
        out = asyncio.ensure_future(self._wait(target, now))
        self._out[target] = out
        out.add_done_callback(lambda _: self._sent(target))

    def _sent(self, target: RespClient) -> None:
        del self._out[target]
        if target in self._open:
            self._send(target)

    async def _wait(self, target: RespClient, now: _Round) -> None:
        acknowledged = 0
        try:
            if target.live is now.connection:  # else their writes were on another connection
                acknowledged = int(await target.execute(
                    "WAIT", self.replicas, self.wait_ms,
                    timeout_s=self.wait_ms / 1000 + target.timeout_s))
                if target.live is not now.connection:
                    acknowledged = 0  # a WAIT that a new connection answered covers nothing
        except Exception as exc:  # any failure means: not confirmed
            log.warning("WAIT for %d replicas failed: %s", self.replicas, exc)
            acknowledged = 0
        if acknowledged < self.replicas:
            target.recheck_soon()  # with Sentinel: is this still the master?
            log.debug("%d replica(s) of %d confirmed %d admission(s) within %d ms",
                      acknowledged, self.replicas, now.waiting, self.wait_ms)
        if not now.future.done():
            now.future.set_result(acknowledged)
