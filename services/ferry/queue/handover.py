"""Entries another batcher offered to a model's shared budget (``batcher.budget``), moved to
this consumer so that they ride its batch: only those their owner still holds, delivery counts
kept (``lua/take_riders.lua``), one script per stream in one round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ferry import keys, lua
from ferry.queue.base import Delivery
from ferry.queue.entries import delivery, task_field
from ferry.resp.client import Commands


class RiderKeys(NamedTuple):
    stream: str


class RiderArgs(NamedTuple):
    group: str
    consumer: str


class RiderItem(NamedTuple):
    entry_id: str
    owner: str


TAKE_RIDERS = lua.ScriptSpec("ferry.queue", "take_riders", RiderKeys._fields, RiderArgs._fields,
                             item=RiderItem._fields)


class RiderMove:
    """Moves offered entries of any partition's streams to ``consumer``."""

    def __init__(self, redis: Commands, consumer: str,
                 streams: Sequence[tuple[int, str]]) -> None:
        self.redis = redis
        self.consumer = consumer
        self.partition_of = {stream: partition for partition, stream in streams}
        self._script = redis.register_script(lua.source(TAKE_RIDERS))

    async def move(self, riders: Sequence[tuple[str, str, str]]) -> list[Delivery]:
        """The riders (owner, stream, entry id) their owners still held, now this consumer's,
        with their tasks."""
        by_stream: dict[str, list[RiderItem]] = {}
        for owner, stream, entry_id in riders:
            if stream in self.partition_of:  # a stream of this queue, nothing else
                by_stream.setdefault(stream, []).append(RiderItem(entry_id, owner))
        if not by_stream:
            return []
        streams = list(by_stream)
        replies = await self.redis.pipeline([
            self._script.command(RiderKeys(stream),
                                 [*RiderArgs(keys.CONSUMER_GROUP, self.consumer),
                                  *lua.items(by_stream[stream])])
            for stream in streams])
        return [delivery(self.partition_of[stream], stream, entry_id, task_field(fields),
                         int(count))
                for stream, moved in zip(streams, replies, strict=True)
                for entry_id, fields, count in moved]
