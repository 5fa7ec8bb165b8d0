"""``owned_partitions=auto``: a batcher replica whose partitions follow the replica count.

Replica ``ordinal`` of ``n`` owns the partitions ``spread`` gives it. The supervisor reads the
count every ``replicas_check_s``; when it changes, the running batcher stops as on SIGTERM (its
unfinished work handed back to the streams, nothing lost) and a new one starts on the new
partitions. Between the two, a partition may be read by its old and new owner for a moment, or
by none: the consumer group makes both safe (an entry is delivered to one consumer, and what an
owner leaves pending is reclaimed).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import replace

from ferry.batcher.replicas import FixedReplicas, ReplicaCount, StatefulSetReplicas
from ferry.batcher.worker import Batcher
from ferry.errors import ConfigError
from ferry.rules.ownership import as_spec, ordinal_of, spread
from ferry.settings import BatcherSettings

log = logging.getLogger(__name__)


def replica_count(settings: BatcherSettings) -> ReplicaCount:
    if settings.replicas:
        return FixedReplicas(settings.replicas)
    return StatefulSetReplicas(settings.statefulset)


class Supervisor:
    """Runs one batcher at a time, on the partitions its ordinal owns now."""

    def __init__(self, settings: BatcherSettings, *, replicas: ReplicaCount | None = None,
                 hostname: str | None = None,
                 factory: Callable[[BatcherSettings], Batcher] = Batcher.from_settings) -> None:
        self.settings = settings
        self.replicas = replicas or replica_count(settings)
        ordinal = settings.ordinal if settings.ordinal >= 0 else ordinal_of(
            hostname or socket.gethostname())
        if ordinal is None:
            raise ConfigError("owned_partitions=auto needs ordinal, or a host name ending in "
                              "-<ordinal> (a StatefulSet pod)")
        self.ordinal = ordinal
        self.factory = factory
        self.stopping = asyncio.Event()
        self.batcher: Batcher | None = None
        self.owned: tuple[int, ...] = ()

    async def run(self) -> int:
        """Until SIGINT or SIGTERM (0) or a batcher's loop dies (1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        return await self.supervise()

    async def supervise(self) -> int:
        count = await self.replicas()
        while not self.stopping.is_set():
            self.owned = spread(self.ordinal, max(1, count), self.settings.partitions)
            failed = await self._serve(count)
            if failed:
                return 1
            count = await self._count(count)
        return 0

    async def _serve(self, count: int) -> bool:
        """Run a batcher on the owned partitions (or idle, owning none) until the count
        changes or the supervisor stops; whether the batcher failed."""
        log.info("replica %d of %d owns partitions %s", self.ordinal, count,
                 as_spec(self.owned) or "none")
        changed = asyncio.create_task(self._until_changed(count))
        stopping = asyncio.create_task(self.stopping.wait())
        waits = [changed, stopping]
        self.batcher = None
        if self.owned:
            self.batcher = self.factory(replace(self.settings,
                                                owned_partitions=as_spec(self.owned)))
            await self.batcher.start()
            waits.append(asyncio.create_task(self.batcher.failed.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
            if self.batcher is not None:
                await self.batcher.stop()
        return self.batcher is not None and self.batcher.failed.is_set()

    async def _until_changed(self, count: int) -> None:
        while await self._count(count) == count:
            await asyncio.sleep(self.settings.replicas_check_s)

    async def _count(self, current: int) -> int:
        try:
            return await self.replicas()
        except Exception as exc:  # the API is down: keep what we own
            log.warning("cannot read the replica count (%s); keeping %d", exc, current)
            return current
