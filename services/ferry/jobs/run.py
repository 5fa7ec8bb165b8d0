"""One job's run: fed, collected and finished by the runner that holds its lease
(``jobs.runner``), through the engine's port to the task system (``jobs.port``).

A ``JobRun`` feeds its job's items as ordinary tasks at batch priority, keeping at most a window
of them in flight, collects their results as they end, and commits them in segments. Everything
it has done is durable before it goes on: items are recorded in flight (with the cursor) before
they are admitted, and a segment's file is written before its items are committed. A run killed
at any moment is resumed by whichever runner takes the lease next, from what Redis and the blob
store hold, and the output holds every item exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from ferry.errors import ClientError, RedisUnavailableError, TooManyRequestsError
from ferry.jobs.blobs import BlobStore
from ferry.jobs.items import ItemMaker
from ferry.jobs.manifest import LineError, read_item
from ferry.jobs.model import ItemStatus, JobStatus, end_state, moving, sources
from ferry.jobs.port import Tasks
from ferry.jobs.results import (
    TASK_ERROR_CODES,
    Result,
    failure,
    from_record,
    line_number,
    merged,
    segment_bytes,
    status_of,
)
from ferry.jobs.store import JobStore, record_of
from ferry.tasks.base import Owner
from ferry.tasks.envelope import Envelope
from ferry.tasks.record import Status, StoredRecord
from ferry.tasks.waiters import Watch

log = logging.getLogger(__name__)
NO_TASK = "-"  # a flight entry's task id when the item never became a task (it failed at once)
ADMIT_BACKOFF_S = 0.5  # an item refused for backlog waits this long before it asks again
WATCH_POLL_S = 15.0  # a watched task's record is read again this often, announcements or not
COLLECT_WAIT_S = 0.25  # the longest a run waits for an item's end before it looks around
CHECK_EVERY_S = 0.2  # how often a run reads its job's record for a cancel or the window's end
PENDING = StoredRecord(Status.PENDING, b"")  # what a task being admitted is known to be


def input_name(job_id: str) -> str:
    return f"jobs/{job_id}/input.jsonl"


@dataclass
class Flying:
    """An item in flight: its task (``NO_TASK`` while none was admitted) and its line."""

    task_id: str
    offset: int
    custom_id: str = ""  # known once fed by this run ('' after a resume: read from the line)
    admitted: bool = False
    retry_at: float = 0.0  # monotonic time before which it is not admitted again
    cancel_asked: bool = False


@dataclass
class Feed:
    """What a run has fed: the cursor (next line) and its byte offset, and what is in flight."""

    cursor: int
    offset: int
    total: int
    flight: dict[int, Flying] = field(default_factory=dict)
    done: bytearray = field(default_factory=bytearray)  # the job's done bits (Redis's layout)

    def is_done(self, index: int) -> bool:
        byte = index >> 3
        return byte < len(self.done) and bool(self.done[byte] & (0x80 >> (index & 7)))

    def mark_done(self, index: int) -> None:
        byte = index >> 3
        if byte >= len(self.done):
            self.done.extend(bytes(byte + 1 - len(self.done)))
        self.done[byte] |= 0x80 >> (index & 7)

    def moved_to(self, cursor: int, offset: int) -> None:
        """The next line to feed is ``cursor``, at byte ``offset`` of the input."""
        self.cursor, self.offset = cursor, offset

    @property
    def exhausted(self) -> bool:
        return self.cursor >= self.total


@dataclass(frozen=True)
class Ready:
    """An item made into a task, not yet admitted."""

    envelope: Envelope
    custom_id: str

    @property
    def task_id(self) -> str:
        return self.envelope.task.task_id


@dataclass(frozen=True)
class RunSettings:
    window: int = 256  # items in flight per client (a client's jobs share it)
    lease_ms: int = 15_000
    segment_items: int = 256  # results per committed segment, at most
    segment_s: float = 1.0  # a segment is committed at least this often while items end
    discover_s: float = 1.0
    max_jobs: int = 64  # jobs one runner process feeds at once


@dataclass(frozen=True)
class Feeder:
    """What a run is given by its runner: the job store (its lease's token), the blob store,
    the items' maker, the task system, and how many more items a run may have in flight."""

    store: JobStore
    token: str
    blobs: BlobStore
    items: ItemMaker
    tasks: Tasks
    settings: RunSettings
    room: Callable[[JobRun], Awaitable[int]]


class LeaseLost(Exception):
    """The run's lease is another runner's now: it stops, writing nothing more."""


class JobRun:
    """One job, fed by this process while it holds the job's lease."""

    def __init__(self, runner: Feeder, job_id: str) -> None:
        self.runner = runner
        self.job_id = job_id
        self.store = runner.store
        self.token = runner.token
        self.fields: dict[str, str] = {}
        self.feed = Feed(0, 0, 0)
        self.ended: list[Result] = []
        self.arrived: asyncio.Queue[tuple[int, StoredRecord | None]] = asyncio.Queue()
        self.watchers: dict[int, asyncio.Task[None]] = {}
        self.unadmitted: set[int] = set()  # items in flight whose task is to be admitted
        self.checked_at = 0.0  # when the job's record was last read
        self.segment_started = time.monotonic()
        self.ending = JobStatus.RUNNING  # CANCELLING or EXPIRED once feeding must stop

    @property
    def client(self) -> str:
        return self.fields.get("client", "")

    @property
    def stopped_as(self) -> ItemStatus:
        """How an item that feeding stopped ends: expired when the window closed, else
        cancelled."""
        return ItemStatus.EXPIRED if self.ending is JobStatus.EXPIRED else ItemStatus.CANCELLED

    async def _line_at(self, offset: int) -> bytes:
        """The manifest's line at byte ``offset`` (b'{}' past its end)."""
        lines = await self.runner.blobs.lines(input_name(self.job_id), offset, 1)
        return lines[0][1] if lines else b"{}"

    @property
    def queued(self) -> int:
        """Items fed whose tasks have not ended (those that ended wait only for their commit):
        what the window bounds."""
        return len(self.feed.flight) - len(self.ended) - self.arrived.qsize()

    async def run(self) -> None:
        try:
            if not await self._load():
                return
            if JobStatus(self.fields["status"]) is not JobStatus.FINALIZING:
                await self._feed_all()
            await self._finalize()
        finally:
            for watcher in self.watchers.values():
                watcher.cancel()

    async def _load(self) -> bool:
        fields = await self.store.fields(self.job_id)
        if fields is None or (JobStatus(fields["status"]).final and not fields.get("retry")):
            await self.store.retire(self.job_id)
            return False
        self.fields = fields
        if fields.get("retry") == "1":
            await self._forget_failed()
            fields = await self.store.fields(self.job_id) or fields
            self.fields = fields
        flight = await self.store.flight(self.job_id)
        self.feed = Feed(int(fields.get("cursor", 0)), int(fields.get("offset", 0)),
                         int(fields["total"]),
                         {i: Flying(t, o) for i, (t, o) in flight.items()},
                         bytearray(await self.store.done_bits(self.job_id)))
        status = JobStatus(fields["status"])
        if status is JobStatus.QUEUED:
            await self.store.move(self.job_id, moving(status, JobStatus.RUNNING),
                                  JobStatus.RUNNING)
        if status is JobStatus.CANCELLING:
            self.ending = JobStatus.CANCELLING
        self._resume_watches()
        return True

    async def _forget_failed(self) -> None:
        """A retry: the items whose last result failed are fed again."""
        failed = []
        for line in await merged(self.runner.blobs, await self.store.segments(self.job_id)):
            if status_of(line) is ItemStatus.FAILED:
                failed.append(line_number(line) - 1)
        if not await self.store.forget_done(self.job_id, self.token, failed, ItemStatus.FAILED):
            raise LeaseLost(self.job_id)

    async def _feed_all(self) -> None:
        while True:
            await self._check_state()
            if self.ending is JobStatus.RUNNING:
                await self._feed_more()
            elif self.feed.flight or not self.feed.exhausted:
                await self._stop_feeding()
            await self._collect()
            if self.feed.exhausted and not self.feed.flight:
                await self._commit(force=True)
                return

    async def _check_state(self) -> None:
        """Read the job's record (a cancel, its window's end), at most every ``CHECK_EVERY_S``."""
        now = time.monotonic()
        if now - self.checked_at < CHECK_EVERY_S:
            return
        self.checked_at = now
        fields = await self.store.fields(self.job_id)
        if fields is None:
            raise LeaseLost(self.job_id)
        self.fields = fields
        if self.ending is not JobStatus.RUNNING:
            return
        if fields.get("status") == JobStatus.CANCELLING.value:
            self.ending = JobStatus.CANCELLING
        elif time.time() >= float(fields.get("expires", "inf")):
            self.ending = JobStatus.EXPIRED

    # -- feeding -------------------------------------------------------------------------

    async def _feed_more(self) -> None:
        await self._admit_waiting()
        room = await self.runner.room(self)
        if room <= 0 or self.feed.exhausted:
            return
        lines = await self.runner.blobs.lines(input_name(self.job_id), self.feed.offset,
                                              min(room, self.runner.settings.segment_items))
        chosen: list[tuple[int, int, bytes]] = []
        offset = self.feed.offset
        cursor = self.feed.cursor
        for next_offset, raw in lines:
            if not self.feed.is_done(cursor):
                chosen.append((cursor, offset, raw))
            cursor, offset = cursor + 1, next_offset
        made = [await self._prepare(index, line_offset, raw)
                for index, line_offset, raw in chosen]
        entries = [(index, prepared.task_id if prepared else NO_TASK, line_offset)
                   for (index, line_offset, _), prepared in zip(chosen, made, strict=True)]
        if not await self.store.fly(self.job_id, self.token, entries, cursor, offset):
            raise LeaseLost(self.job_id)
        self.feed.moved_to(cursor, offset)
        for index, task_id, line_offset in entries:
            self.feed.flight[index] = Flying(task_id, line_offset)
        await asyncio.gather(*(self._admit(index, prepared) for (index, _, _), prepared
                               in zip(entries, made, strict=True) if prepared is not None))

    async def _prepare(self, index: int, offset: int, raw: bytes) -> Ready | None:
        """The item's task, ready to admit; None when it failed at once (its result is
        ended)."""
        maker = self.runner.items
        custom_id = ""
        try:
            item = read_item(raw, index + 1, maker.sources)
            custom_id = item.custom_id
            submission = await maker.submission(item, self.fields)
            return Ready(await self.runner.tasks.prepare(submission), custom_id)
        except LineError as exc:
            self.ended.append(failure(index, custom_id, ItemStatus.FAILED, exc.problem.code,
                                      exc.problem.message))
        except ClientError as exc:
            self.ended.append(failure(index, custom_id, ItemStatus.FAILED, exc.code,
                                      exc.message))
        return None

    async def _admit(self, index: int, ready: Ready) -> None:
        """Admit a fed item's task, watched from before its admission (no end is missed);
        refused for backlog, it asks again later."""
        flying = self.feed.flight[index]
        flying.custom_id = ready.custom_id
        self._watch(index, ready.task_id, fresh=True)
        try:
            admitted = await self.runner.tasks.admit(ready.envelope, Owner(self.client))
        except (TooManyRequestsError, ClientError) as exc:
            self.watchers.pop(index).cancel()
            if isinstance(exc, TooManyRequestsError):
                flying.retry_at = time.monotonic() + ADMIT_BACKOFF_S
                self.unadmitted.add(index)
            else:
                self.ended.append(failure(index, ready.custom_id, ItemStatus.FAILED, exc.code,
                                          exc.message))
            return
        flying.admitted = True
        if admitted.record.status.final:  # a cache hit: answered at admission
            self.watchers.pop(index).cancel()
            self.arrived.put_nowait((index, admitted.record))

    async def _admit_waiting(self) -> None:
        """Items in flight with no task admitted (refused for backlog, or found so on resume):
        made again (a fresh task id, recorded before admission) and admitted."""
        now = time.monotonic()
        for index in sorted(self.unadmitted):
            flying = self.feed.flight.get(index)
            if flying is None or flying.admitted or index in self.watchers:
                self.unadmitted.discard(index)
                continue
            if flying.retry_at > now:
                continue
            self.unadmitted.discard(index)
            if any(r.index == index for r in self.ended):
                continue
            prepared = await self._prepare(index, flying.offset,
                                           await self._line_at(flying.offset))
            if prepared is None:
                continue
            entry = (index, prepared.task_id, flying.offset)
            if not await self.store.fly(self.job_id, self.token, [entry], self.feed.cursor,
                                        self.feed.offset):
                raise LeaseLost(self.job_id)
            flying.task_id = entry[1]
            await self._admit(index, prepared)

    def _watch(self, index: int, task_id: str, *, fresh: bool = False) -> None:
        """Watch the item's task from now (``fresh``: it is being admitted, known PENDING)."""
        watching = contextlib.ExitStack()  # entered now: an end announced from here is seen
        watch = watching.enter_context(self.runner.tasks.watch(task_id))
        watcher = asyncio.create_task(self._await_end(index, watch, fresh))
        watcher.add_done_callback(lambda _: watching.close())
        self.watchers[index] = watcher

    async def _await_end(self, index: int, watch: Watch, fresh: bool) -> None:
        """Wait for the item's task to end (announced, or read every ``WATCH_POLL_S``); a task
        with no record (expired, or never admitted) is reported as None."""
        known, read_first = (PENDING, False) if fresh else (None, True)
        while True:
            try:
                record = await watch.final(WATCH_POLL_S, known, read_first=read_first)
            except RedisUnavailableError as exc:
                log.warning("job %s: reading task %s failed (%s)", self.job_id, watch.task_id,
                            exc)
                await asyncio.sleep(1.0)
                record = None if read_first else known
            known, read_first = None, True
            if record is None or record.status.final:
                self.arrived.put_nowait((index, record))
                return

    def _resume_watches(self) -> None:
        """After a restart: watch every item in flight that has a task."""
        for index, flying in self.feed.flight.items():
            if flying.task_id == NO_TASK:
                self.unadmitted.add(index)  # it failed at once: made again, and fails again
            elif index not in self.watchers:
                flying.admitted = True
                self._watch(index, flying.task_id)

    # -- collecting ----------------------------------------------------------------------

    async def _collect(self) -> None:
        """Take the items that ended (waiting a little for one), and commit a segment when it
        is full or old enough."""
        wait_s = min(COLLECT_WAIT_S, self.runner.settings.segment_s -
                     (time.monotonic() - self.segment_started))
        if not self.ended:
            wait_s = COLLECT_WAIT_S  # nothing to commit: wait for an end (never spin)
        if self.arrived.empty() and wait_s > 0:
            with contextlib.suppress(TimeoutError):
                first = await asyncio.wait_for(self.arrived.get(), wait_s)
                await self._arrive(*first)
        while not self.arrived.empty():
            await self._arrive(*self.arrived.get_nowait())
        await self._commit()

    async def _arrive(self, index: int, record: StoredRecord | None) -> None:
        self.watchers.pop(index, None)
        flying = self.feed.flight.get(index)
        if flying is None:
            return
        if record is None:  # no record: admit it again
            flying.admitted, flying.retry_at = False, 0.0
            self.unadmitted.add(index)
            return
        custom_id = flying.custom_id or _field(await self._line_at(flying.offset), "custom_id")
        self.ended.append(from_record(index, custom_id, flying.task_id, record,
                                      self.stopped_as))

    async def _commit(self, *, force: bool = False) -> None:
        settings = self.runner.settings
        old = time.monotonic() - self.segment_started >= settings.segment_s
        if not self.ended or not (force or old or len(self.ended) >= settings.segment_items):
            if not self.ended:
                self.segment_started = time.monotonic()
            return
        ended, self.ended = self.ended, []
        name = f"jobs/{self.job_id}/segments/{time.time_ns():020d}-{self.token}.jsonl"
        await self.runner.blobs.put(name, segment_bytes(ended))
        if not await self.store.commit(self.job_id, self.token, name,
                                       [(r.index, r.status) for r in ended]):
            raise LeaseLost(self.job_id)
        for result in ended:
            self.feed.flight.pop(result.index, None)
            self.feed.mark_done(result.index)
        self.segment_started = time.monotonic()

    # -- cancel and expiry -------------------------------------------------------------

    async def _stop_feeding(self) -> None:
        """Cancel every item in flight that has not reached Triton (those that have finish and
        are kept), end the items never fed, and let the rest end."""
        as_status = self.stopped_as
        for index, flying in list(self.feed.flight.items()):
            if flying.cancel_asked:
                continue
            flying.cancel_asked = True
            if flying.admitted:
                await self.runner.tasks.cancel(flying.task_id, self.client)
            elif not any(r.index == index for r in self.ended):
                self.ended.append(_unfed(index, await self._line_at(flying.offset),
                                         as_status))
        await self._end_unfed(as_status)

    async def _end_unfed(self, as_status: ItemStatus) -> None:
        """Every item not fed yet ends ``as_status``, a segment at a time."""
        settings = self.runner.settings
        while not self.feed.exhausted:
            lines = await self.runner.blobs.lines(input_name(self.job_id), self.feed.offset,
                                                  settings.segment_items)
            cursor = self.feed.cursor
            for _, raw in lines:
                if not self.feed.is_done(cursor):
                    self.ended.append(_unfed(cursor, raw, as_status))
                cursor += 1
            await self._commit(force=True)
            offset = lines[-1][0] if lines else self.feed.offset
            if not await self.store.set_fenced(self.job_id, self.token, cursor=cursor,
                                               offset=offset):
                raise LeaseLost(self.job_id)
            self.feed.moved_to(cursor if lines else self.feed.total, offset)

    # -- the end -----------------------------------------------------------------------

    async def _finalize(self) -> None:
        """Write the output and error files (each item once, in line order) and end the job."""
        status = JobStatus(self.fields["status"])
        ending = (JobStatus.CANCELLING if status is JobStatus.CANCELLING else self.ending)
        await self.store.move(self.job_id, sources(JobStatus.FINALIZING), JobStatus.FINALIZING,
                              ending=ending.value)
        fields = await self.store.fields(self.job_id) or self.fields
        ending = JobStatus(fields.get("ending") or ending.value)
        blobs = self.runner.blobs
        outputs = blobs.writer(f"jobs/{self.job_id}/output.jsonl")
        errors = blobs.writer(f"jobs/{self.job_id}/errors.jsonl")
        for line in await merged(blobs, await self.store.segments(self.job_id)):
            target = outputs if status_of(line) is ItemStatus.SUCCEEDED else errors
            await target.write(line + b"\n")
        await outputs.commit()
        await errors.commit()
        counts = record_of(self.job_id, fields).counts
        final, reason = end_state(counts, ending)
        await self.store.move(self.job_id, moving(JobStatus.FINALIZING, final), final,
                              reason=reason,
                              **{"file:output": f"jobs/{self.job_id}/output.jsonl",
                                 "file:errors": f"jobs/{self.job_id}/errors.jsonl"})
        await self.store.retire(self.job_id)


def _field(line: bytes, name: str) -> str:
    with contextlib.suppress(ValueError):
        value = orjson.loads(line).get(name)
        if isinstance(value, str | int):
            return str(value)
    return ""


def _unfed(index: int, raw: bytes, status: ItemStatus) -> Result:
    code = TASK_ERROR_CODES[status]
    message = ("the job was cancelled before this item was fed" if status is
               ItemStatus.CANCELLED else "the job's completion window closed before this "
               "item was fed")
    return failure(index, _field(raw, "custom_id"), status, code, message)

