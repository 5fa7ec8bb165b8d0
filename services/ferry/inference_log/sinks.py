"""Where the logger writes records: JSONL files, rotated by size and age, in a directory or an
S3-compatible bucket (through the jobs' blob store), or CloudEvents POSTed to a collector.

A sink takes entries and answers which of them it now holds for good: the logger acknowledges
those, and only those, in Redis (at-least-once: what a failure cuts short is written again). A
file holds its entries once it is committed (renamed into place, or its upload completed), so a
reader never sees half a file: a file is committed when it reaches ``log_rotate_bytes`` or
``log_rotate_s`` after it was opened (``due``, for files no new record reached). A failed write
raises ``SinkError``; ``discard`` then drops what was not committed, for the logger to read
again from its stream.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, Protocol

import httpx
import orjson

from ferry.errors import ConfigError, FerryError
from ferry.inference_log.events import events_of
from ferry.jobs.blobs import BlobStore, BlobWriter, S3Keys, blob_store

HTTP_TIMEOUT_S = 10.0
HTTP_CONCURRENCY = 16  # records whose events are being POSTed at once


class SinkError(FerryError):
    """The sink did not take records (a disk, a bucket or a collector refused or is away)."""


class Entry(NamedTuple):
    """One record read from a model's log stream: the model, its entry id there, its JSON."""

    model: str
    entry_id: str
    record: bytes


class Sink(Protocol):
    """What the logger writes through."""

    async def put(self, entries: Sequence[Entry]) -> list[Entry]:
        """Take ``entries``; those it now holds for good (to acknowledge). ``SinkError``: it
        took none for good (what it held before stays held)."""
        ...

    async def due(self) -> list[Entry]:
        """What it holds for good now that time has passed (files rotated by age)."""
        ...

    async def discard(self) -> None:
        """Forget what it took and does not hold for good (after a ``SinkError``)."""
        ...

    async def close(self) -> list[Entry]:
        """Hold for good what it took (the open files committed); then nothing more."""
        ...


@dataclass(frozen=True)
class Rotation:
    """When a file is committed and the next one begun: at ``max_bytes``, or ``max_s`` after
    it was opened."""

    max_bytes: int
    max_s: float

    def due(self, size: int, opened_at: float, now: float) -> bool:
        return size >= self.max_bytes or now - opened_at >= self.max_s


def segment_name(model: str, opened_at: float) -> str:
    """A file's name: by model and day, then the time it was opened (names sort by time) and
    a random part (two loggers never share one): ``sim/2026-11-28/140512-3fa9c1d2.jsonl``."""
    at = datetime.fromtimestamp(opened_at, UTC)
    return f"{model}/{at:%Y-%m-%d}/{at:%H%M%S}-{secrets.token_hex(4)}.jsonl"


@dataclass
class Segment:
    """An open file and the entries written to it."""

    writer: BlobWriter
    name: str
    opened_at: float
    size: int = 0
    entries: list[Entry] = field(default_factory=list)

    def add(self, entries: Sequence[Entry], size: int) -> None:
        self.entries += entries
        self.size += size


def _filling(entries: Sequence[Entry], room: int) -> int:
    """How many of ``entries`` (at least one) go before a file with ``room`` bytes left is
    full: the one that fills it goes too."""
    used = 0
    for count, entry in enumerate(entries, 1):
        used += len(entry.record) + 1
        if used >= room:
            return count
    return len(entries)


class FileSink:
    """JSONL files, one open per model, rotated by ``rotation`` (a directory or a bucket)."""

    def __init__(self, store: BlobStore, rotation: Rotation,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.rotation = rotation
        self.clock = clock
        self._open: dict[str, Segment] = {}

    async def put(self, entries: Sequence[Entry]) -> list[Entry]:
        by_model: dict[str, list[Entry]] = {}
        for entry in entries:
            by_model.setdefault(entry.model, []).append(entry)
        held: list[Entry] = []
        for model, some in by_model.items():
            held += await self._write(model, some)
        return held

    async def _write(self, model: str, entries: Sequence[Entry]) -> list[Entry]:
        """A model's entries, a file at a time: each committed once it reaches its size."""
        held: list[Entry] = []
        while entries:
            segment = self._segment(model)
            taken = _filling(entries, self.rotation.max_bytes - segment.size)
            data = b"".join(entry.record + b"\n" for entry in entries[:taken])
            await _failing(segment.writer.write(data))
            segment.add(entries[:taken], len(data))
            entries = entries[taken:]
            if self.rotation.due(segment.size, segment.opened_at, self.clock()):
                held += await self._commit(model)
        return held

    def _segment(self, model: str) -> Segment:
        segment = self._open.get(model)
        if segment is None:
            now = self.clock()
            name = segment_name(model, now)
            segment = self._open[model] = Segment(self.store.writer(name), name, now)
        return segment

    async def _commit(self, model: str) -> list[Entry]:
        segment = self._open.pop(model)
        try:
            await _failing(segment.writer.commit())
        except SinkError:
            await segment.writer.abort()
            raise
        return segment.entries

    async def due(self) -> list[Entry]:
        now, held = self.clock(), []
        for model, segment in list(self._open.items()):
            if self.rotation.due(segment.size, segment.opened_at, now):
                held += await self._commit(model)
        return held

    async def discard(self) -> None:
        segments, self._open = list(self._open.values()), {}
        for segment in segments:
            await segment.writer.abort()

    async def close(self) -> list[Entry]:
        held = []
        for model in list(self._open):
            held += await self._commit(model)
        return held


async def _failing(step: Awaitable[None]) -> None:
    """Await a blob store's step; what it raises (a disk full, a bucket away) is a
    ``SinkError``."""
    try:
        await step
    except (OSError, RuntimeError, ValueError) as exc:  # obstore's errors are among these
        raise SinkError(f"writing a log file failed: {exc}") from exc


class EventSink:
    """Each record as two CloudEvents (request, response) POSTed to ``url``: held once the
    collector answered 2xx to both."""

    def __init__(self, url: str, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.url = url
        self._client = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False)
        self._slots = asyncio.Semaphore(HTTP_CONCURRENCY)

    async def put(self, entries: Sequence[Entry]) -> list[Entry]:
        results = await asyncio.gather(*(self._post(entry) for entry in entries),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result if isinstance(result, SinkError) else SinkError(
                    f"posting to {self.url} failed: {result!r}")
        return list(entries)

    async def _post(self, entry: Entry) -> None:
        async with self._slots:
            for event in events_of(orjson.loads(entry.record)):
                try:
                    response = await self._client.post(self.url, content=event.body,
                                                       headers=event.headers)
                except httpx.HTTPError as exc:
                    raise SinkError(f"{self.url}: {exc!r}") from exc
                if not response.is_success:
                    raise SinkError(f"{self.url} answered {response.status_code}")

    async def due(self) -> list[Entry]:
        return []

    async def discard(self) -> None:
        return None

    async def close(self) -> list[Entry]:
        await self._client.aclose()
        return []


def open_sink(location: str, rotation: Rotation, *, s3_endpoint: str = "",
              s3_keys: S3Keys | None = None, clock: Callable[[], float] = time.time) -> Sink:
    """The sink ``log_sink`` names: ``http(s)://`` a CloudEvents collector; ``s3://bucket/prefix``
    files in a bucket; a directory (or ``file://DIR``) files there (created if missing)."""
    if location.startswith(("http://", "https://")):
        return EventSink(location)
    if not location.startswith("s3://"):
        directory = Path(location.removeprefix("file://"))
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"log_sink: {location!r} cannot be created: {exc}") from None
    return FileSink(blob_store(location, s3_endpoint, s3_keys), rotation, clock)
