"""Replica-acknowledged writes: ``WAIT`` for the admissions of a round, shared by all of them.

Redis replicates asynchronously: a master that answered an admission and died before a replica
received it takes the task with it. ``WAIT n ms`` blocks the connection that sent it until ``n``
replicas have acknowledged every write that connection made before it (or ``ms`` pass), and
answers how many did. Ferry's hot path sends every caller's commands over one connection, so one
``WAIT`` covers every admission answered before it was sent: admissions that end in the same turn
of the event loop share one (a group commit), and the cost is one more round trip per turn, not
one per task.

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

from ferry.resp.client import Commands, RespClient
from ferry.resp.cluster import ClusterClient

log = logging.getLogger(__name__)


@dataclass
class _Round:
    """The callers that one WAIT confirms; ``connection`` is Redis's id of the connection their
    writes were answered on (a WAIT on another connection would confirm nothing of theirs)."""

    future: asyncio.Future[int]
    connection: int | None
    waiting: int = field(default=0)


class ReplicaAcks:
    """How many replicas have a caller's writes, asked once per turn of the loop per
    connection."""

    def __init__(self, client: Commands, replicas: int, wait_ms: int) -> None:
        self.client = client
        self.replicas = replicas
        self.wait_ms = wait_ms
        self._open: dict[RespClient, _Round] = {}
        self._sent: set[asyncio.Future[None]] = set()  # WAITs in flight (held, not collected)

    async def confirmed(self, key: str) -> bool:
        """Whether ``replicas`` replicas have this connection's writes so far (the caller's
        write to ``key`` among them), within ``wait_ms``."""
        target = await self._connection_of(key)
        now = self._open.get(target)
        if now is None or now.connection != target.connection_id:
            loop = asyncio.get_running_loop()
            now = _Round(loop.create_future(), target.connection_id)
            self._open[target] = now
            loop.call_soon(self._send, target, now)
        now.waiting += 1
        return await asyncio.shield(now.future) >= self.replicas

    async def _connection_of(self, key: str) -> RespClient:
        if isinstance(self.client, ClusterClient):
            return await self.client.node_of(key)
        assert isinstance(self.client, RespClient), "a lean client has one connection or a node's"
        return self.client

    def _send(self, target: RespClient, now: _Round) -> None:
        if self._open.get(target) is now:
            del self._open[target]  # later callers wait for the next round
        sent = asyncio.ensure_future(self._wait(target, now))
        self._sent.add(sent)
        sent.add_done_callback(self._sent.discard)

    async def _wait(self, target: RespClient, now: _Round) -> None:
        acknowledged = 0
        try:
            if target.connection_id == now.connection:  # else their writes were on another
                acknowledged = int(await target.execute(
                    "WAIT", self.replicas, self.wait_ms,
                    timeout_s=self.wait_ms / 1000 + target.timeout_s))
                if target.connection_id != now.connection:
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
