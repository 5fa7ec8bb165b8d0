"""Channels heard in every shard of a Redis Cluster (sharded Pub/Sub), one subscriber per slot.

A Lua script may only publish in its own slot, and a plain ``PUBLISH`` on a cluster reaches a
subscriber on another node over the cluster bus: a hop that adds about a millisecond, and in
about one message of a hundred 20-40 ms (measured on Redis 7.0 here). So on a cluster each
partition's scripts ``SPUBLISH`` on the partition's own copy of a channel (its name followed by
the partition's hash tag), and this listens to every copy on the node that owns it.

The interface is the ``Subscriber``'s (``subscribe``, ``unsubscribe``, ``start``, ``stop``),
so that the result waiters need not know which they have. A channel named here is the base
name; a shard's copy is the name followed by the shard's hash tag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence

from ferry.resp.client import Locate, RedisAddress
from ferry.resp.cluster import ClusterClient
from ferry.resp.subscriber import Subscriber


class ShardedChannels:
    """Every shard's copy of ``channels``, each on the node that owns its hash tag's slot."""

    def __init__(self, cluster: ClusterClient, tags: Sequence[str], channels: Iterable[str],
                 on_message: Callable[[bytes], None], on_connect: Callable[[], None], *,
                 timeout_s: float = 10.0, name: str = "ferry-subscriber") -> None:
        self.cluster = cluster
        self.tags = list(tags)
        bases = list(channels)
        self._shards = [
            Subscriber(cluster.address, [base + tag for base in bases], on_message, on_connect,
                       timeout_s=timeout_s, name=name, locate=self._locator(tag), sharded=True,
                       where=self._owner(tag))
            for tag in self.tags]
        self.connected = _AllSet([sub.connected for sub in self._shards])

    def _locator(self, tag: str) -> Locate:
        """The node that owns ``tag``'s slot: the map asked again at every connect but the
        first (a slot that moved, or a master that failed over, is why there is another)."""
        first, owner = True, self._owner(tag)

        async def locate() -> RedisAddress:
            nonlocal first
            if not first:
                self.cluster.slots_moved()
            first = False
            return await owner()

        return locate

    def _owner(self, tag: str) -> Callable[[], Awaitable[RedisAddress]]:
        """The node that owns ``tag``'s slot in the slot map as it is (after a failover, the
        map is asked again as soon as a command meets the demoted master)."""

        async def owner() -> RedisAddress:
            return (await self.cluster.node_of(tag)).address

        return owner

    def subscribe(self, channel: str) -> asyncio.Future[None] | None:
        """Listen on every shard's copy of ``channel``: None if each is confirmed already,
        else a future done once every one is."""
        pending = [future for sub, tag in zip(self._shards, self.tags, strict=True)
                   if (future := sub.subscribe(channel + tag)) is not None]
        if not pending:
            return None
        return asyncio.ensure_future(_all(pending))

    def unsubscribe(self, channel: str) -> None:
        for sub, tag in zip(self._shards, self.tags, strict=True):
            sub.unsubscribe(channel + tag)

    async def start(self) -> None:
        for sub in self._shards:
            await sub.start()

    async def stop(self) -> None:
        await asyncio.gather(*(sub.stop() for sub in self._shards))


class _AllSet:
    """Set while every one of ``events`` is (the ``connected`` of every shard's subscriber)."""

    def __init__(self, events: Sequence[asyncio.Event]) -> None:
        self.events = events

    def is_set(self) -> bool:
        return all(event.is_set() for event in self.events)


async def _all(futures: Sequence[asyncio.Future[None]]) -> None:
    await asyncio.gather(*futures)
