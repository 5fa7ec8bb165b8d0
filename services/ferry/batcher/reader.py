"""Reading: the read loop and its parking, the reclaim of idle entries, the keep-alive of held
ones, and boarding into the buffer (or settling at once what must not board).

The reader reads every owned partition in one XREADGROUP, each priority within its own room in
the buffer, so that waiting low-priority work never stops high-priority work from being read.

Of what the loops share (``shared.py``) it boards into the work aboard (and marks taken-over
tasks that a client cancelled), owns its pace (``ReadAhead``: parking and reading ahead), and
asks the rest: which priorities are held, when the calls at Triton should end, whether Triton
can be reached, whether the batcher stops.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from ferry.backoff import backoff_delay
from ferry.batcher.executor import Outcome
from ferry.batcher.models import ModelBook
from ferry.batcher.shared import Shared
from ferry.batcher.tensor_batch import signature
from ferry.errors import RedisUnavailableError
from ferry.priority import BY_URGENCY, Priority
from ferry.queue.base import Delivery, TaskQueue
from ferry.rules import fate
from ferry.rules.policy import Lane
from ferry.settings import BatcherSettings
from ferry.tasks.base import BatcherStore
from ferry.tasks.record import Status
from ferry.telemetry.metrics import BatcherMetrics

log = logging.getLogger(__name__)
PARK_MIN_S = 0.005
MORE_READS = 4  # reads after the first, at once, while a stream gave all it was asked for
ReadStep = tuple[int, list[Priority], bool]  # entries per stream, priorities, only some of them
Woken = Literal["freed", "taken", "ahead", "poll"]  # why a reader parked while busy woke
Settle = Callable[[Sequence[Outcome]], Awaitable[bool]]  # writes final outcomes (the executor's)


def lane_of(delivery: Delivery) -> Lane:
    """The boarding lane: the model and priority, alone for a task delivered before; a tensor
    task's only with tasks of its signature (``tensor_batch.signature``), a pinned one's only
    with tasks of its version."""
    task = delivery.task
    assert task is not None
    if task.inputs:
        return Lane(task.model, Priority.of(task.priority), delivery.deliveries > 1,
                    signature(task))
    if task.model_version:  # a pinned version travels only with tasks of that version
        return Lane(task.model, Priority.of(task.priority), delivery.deliveries > 1,
                    (task.model_version,))
    return Lane(task.model, Priority.of(task.priority), suspect=delivery.deliveries > 1)


def _saturated(deliveries: Sequence[Delivery], count: int) -> bool:
    """Whether some stream gave the whole ``count`` asked of it (it may hold more)."""
    per_stream = Counter(d.stream for d in deliveries)
    return bool(per_stream) and max(per_stream.values()) >= count


class Reader:
    """Boards work from the queue (of the owned partitions): reads, reclaims, keeps held
    entries alive."""

    def __init__(self, settings: BatcherSettings, queue: TaskQueue, store: BatcherStore,
                 metrics: BatcherMetrics, *, shared: Shared, models: ModelBook,
                 settle: Settle) -> None:
        """``settle`` ends at once the tasks that must not board."""
        self.settings = settings
        self.queue = queue
        self.store = store
        self.metrics = metrics
        self.models = models
        self.settle = settle
        self.gate = shared.gate
        self.clock = shared.clock
        self.partitions = tuple(settings.owned)
        self.per_stream = max(1, math.ceil(settings.max_batch / len(self.partitions)))
        self.read_failures = 0  # queue reads failed in a row (Redis unreachable)
        self._aboard = shared.aboard
        self._holding = shared.holding  # priorities held: boarded, or at Triton
        self._pace = shared.read_ahead  # this reader's own
        self._signals = shared.signals

    def rooms(self) -> dict[Priority, int]:
        """Room per priority: each has its own quota, so that waiting low-priority work never
        stops high-priority work from being read."""
        waiting = self._aboard.count_by(lambda lane: lane.priority)
        quota = self.models.buffer_quota()  # a batch per slot, and one more
        return {p: quota - waiting.get(p, 0) for p in BY_URGENCY}

    @property
    def room(self) -> int:
        """How many more tasks may board (of the priority with the most room)."""
        return max(self.rooms().values())

    async def read_loop(self) -> None:
        """Read while a batch could leave; while every slot is busy, park and catch up later.

        A blocking read returns as soon as one entry arrives, so reading on while the backend
        is busy costs a round trip per task and helps no batch leave sooner. Parked (also
        between polls while a priority's room is full), the reader waits for a slot to free (at
        most ``max_wait_ms / 4``), reading ahead just before one is expected to free
        (``ferry.rules.readahead``): the next batch leaves as it frees. Without a fresh
        read-ahead it reads everything that has arrived, of every priority, awake or not, and
        only then does the dispatcher plan: batches are as full and fresh as if it had read all
        along, and a high-priority task rides the next batch.
        """
        signals = self._signals
        block_s = self.settings.read_block_ms / 1000.0
        freed = False  # a slot freed while parked: read every priority, then let the plan run
        while not signals.stopping:
            caught_up, ahead = freed, False
            if not freed and self.models.all_busy():
                woken = await self._park_busy()
                if woken == "taken":
                    continue
                freed, ahead, caught_up = woken == "freed", woken == "ahead", True
            step = self._next_read(every=freed or ahead)
            freed = False
            if step is None:  # full, or Triton is down: leave it queued
                if caught_up:
                    signals.read_done()
                await signals.changed(block_s)
                continue
            count, readable, partial = step
            if partial:  # a blocked read would not see the full priority's room free: poll
                self._pace.watch_room()
            block_ms = 0 if caught_up or partial else self.settings.read_block_ms
            deliveries = await self._take(count, block_ms, readable, ahead=ahead)
            if deliveries is None:
                continue
            if caught_up:
                signals.read_done()  # a slot may have freed: the dispatcher plans again
            if partial and not deliveries:  # until a batch leaves, a slot frees, or a moment
                freed = await self._pace.park(block_s, room=True)

    async def _take(self, count: int, block_ms: int, readable: list[Priority], *,
                    ahead: bool) -> list[Delivery] | None:
        """Read (ahead, or as planned) and board what was read; None if the read failed."""
        try:
            deliveries = await (self._read_ahead(count, readable) if ahead
                                else self._read(count, block_ms, readable))
        except RedisUnavailableError as exc:
            await self._read_failed(exc)
            return None
        self.read_failures = 0
        try:
            await self.board(deliveries)
        finally:
            self._pace.done()  # boarded: a slot that frees now plans with it
        return deliveries

    async def _park_busy(self) -> Woken:
        """Park while every slot is busy, until a slot frees (``freed``; ``taken`` when the
        batch read ahead has taken it and every slot is busy again), it is time to read ahead
        for the next batch (``ahead``, ``ferry.rules.readahead``), or the park times out
        (``poll``: read what has come, without blocking)."""
        pace = self._pace
        at = pace.next_at()
        # at least PARK_MIN_S: reading less must not become polling
        timeout_s = max(PARK_MIN_S, self.settings.max_wait_ms / 4000.0)
        if at is not None:
            timeout_s = min(timeout_s, max(0.0, at - self.clock()))
        if await pace.park(timeout_s):
            return "taken" if pace.fresh() and self.models.all_busy() else "freed"
        return "ahead" if at is not None and self.clock() >= at else "poll"

    async def _read_ahead(self, count: int, readable: list[Priority]) -> list[Delivery]:
        """Read every priority for the next batch while every slot is busy; a slot that frees
        before what it read has boarded waits for it (``ReadAhead.slot_freed``)."""
        started = self._pace.reading()
        try:
            deliveries = await self._read(count, 0, readable)
        except BaseException:
            self._pace.done()  # nothing it read will board
            raise
        self._pace.read(started)
        return deliveries

    async def _read(self, count: int, block_ms: int, readable: list[Priority]
                    ) -> list[Delivery]:
        """Read ``readable``, then at once, before anything boards: a priority whose doorbell
        that rang (its task would otherwise wait for the next read, after the next batch left),
        and again while a stream gave all it was asked for (the batch that leaves next takes
        what is queued, not what one read of ``count`` per stream happened to bring)."""
        deliveries = last = await self.queue.read(count, block_ms, readable)
        asked = count
        for _ in range(MORE_READS):
            rooms = self._rooms_after(deliveries)
            rung = [p for p in self.queue.awake(self._holding())
                    if p not in readable and rooms[p] > 0]
            again = [p for p in readable if rooms[p] > 0] if _saturated(last, asked) else []
            wanted = [p for p in BY_URGENCY if p in rung or p in again]
            if not wanted or not self.gate.is_open:
                break
            readable = list(dict.fromkeys([*readable, *rung]))
            asked = min(count, *(rooms[p] for p in wanted))
            try:
                last = await self.queue.read(asked, 0, wanted)
            except RedisUnavailableError as exc:  # what was read boards; the rest waits for a read
                log.warning("reading on failed (%s); boarding what was read", exc)
                break
            if not last:
                break
            deliveries = [*deliveries, *last]
        return deliveries

    def _rooms_after(self, deliveries: Sequence[Delivery]) -> dict[Priority, int]:
        """Each priority's room once ``deliveries`` (read, not yet boarded) board."""
        rooms = self.rooms()
        for delivery in deliveries:
            if delivery.task is not None:
                priority = Priority.of(delivery.task.priority)
                rooms[priority] -= 1
        return rooms

    def _next_read(self, *, every: bool = False) -> ReadStep | None:
        """How many entries per stream, of which priorities (``every`` one with room, awake or
        asleep), and whether some priority is left out for want of room; None when nothing may
        be read (no room, or Triton is down)."""
        rooms = self.rooms()
        awake = list(BY_URGENCY) if every else self.queue.awake(self._holding(), poll=True)
        readable = [p for p in awake if rooms[p] > 0]
        if not readable or not self.gate.is_open:
            return None
        # per stream: the room spread over the partitions (a read takes as much from each)
        room = min(rooms[p] for p in readable)
        count = min(self.per_stream, max(1, math.ceil(room / len(self.partitions))))
        return count, readable, len(readable) < len(awake)

    async def _read_failed(self, exc: BaseException) -> None:
        self.read_failures += 1
        self._signals.read_done()  # whatever waited for this read plans without it
        log.warning("reading the queue failed (%s); retrying", exc)
        await asyncio.sleep(backoff_delay(self.read_failures + 1, 0.1, 2.0, jitter=1.0))

    async def claim_loop(self) -> None:
        """Reclaim what dead consumers left, heal backlog counts, and look for fair queues
        whose doorbell was missed, every claim interval."""
        interval = self.settings.claim_interval_ms / 1000.0
        while not await self._signals.until_stopped(interval):
            try:
                await self.reclaim()
                await self.store.heal_backlog(self.partitions)
                await self.queue.recheck_fair()
            except RedisUnavailableError as exc:
                log.warning("reclaiming idle tasks failed: %s", exc)

    async def keep_loop(self) -> None:
        """Reset the idle time of held entries, well within ``claim_idle_ms``, on its own timer."""
        interval = max(0.05, self.settings.claim_idle_ms / 3000.0)
        while not await self._signals.until_stopped(interval):
            try:
                await self.queue.touch(self._aboard.held())
            except RedisUnavailableError as exc:
                log.warning("refreshing held tasks failed: %s", exc)

    async def lease_loop(self) -> None:
        """Renew this batcher's lease five times a lease, until the batcher closes (through its
        stop: the work it finishes or hands back then is not taken over); while it reads, take
        over at once what a batcher whose lease ran out held."""
        interval = self.settings.lease_ms / 5000.0
        while True:
            try:
                dead = await self.queue.beat(self.settings.lease_ms)
                if dead and not self._signals.stopping:
                    await self.rescue(dead)
            except RedisUnavailableError as exc:
                log.warning("renewing the lease failed: %s", exc)
            await asyncio.sleep(interval)

    async def rescue(self, dead: Sequence[str]) -> None:
        """Take over, as far as there is room, the tasks of batchers whose lease ran out."""
        for consumer in dead:
            if self.room <= 0 or not self.gate.is_open:
                return
            rescued, left = await self.queue.rescue(consumer, self.room)
            await self._take_over(rescued, f"of batcher {consumer}, whose lease ran out")
            if not left:
                await self.queue.bury(consumer)

    async def reclaim(self) -> None:
        """Take over tasks left idle by consumers that hold no lease, as many as there is
        room for (the backstop: a live batcher keeps its entries from going idle)."""
        if self.room <= 0 or not self.gate.is_open:
            return
        per_stream = max(1, self.room // len(self.partitions))
        claimed = await self.queue.claim_stale(self.settings.claim_idle_ms, per_stream)
        await self._take_over(claimed, "left idle")

    async def _take_over(self, claimed: Sequence[Delivery], why: str) -> None:
        """Board tasks taken from another consumer (those it was asked to cancel, cancelled)."""
        fresh = [d for d in claimed if not self._aboard.is_held(d)]
        if not fresh:
            return
        flags = await self.store.cancel_requested(
            [d.task.task_id if d.task else "" for d in fresh])
        self._aboard.took_over(d.task.task_id for d, flag in zip(fresh, flags, strict=True)
                               if flag and d.task is not None)
        log.info("took over %d task(s) %s", len(fresh), why)
        self.metrics.reclaimed.inc(len(fresh))
        await self.board(fresh)

    async def board(self, deliveries: Sequence[Delivery], *, riders: bool = False) -> None:
        """Put readable tasks in the buffer; settle unreadable or over-delivered ones at once.
        ``riders``: tasks another batcher read, and counted in its arrival rates: not counted
        here, and boarded as of when they were enqueued (not now: they are no newcomers that
        the adaptive flush would wait for company behind)."""
        now, now_ms = self.clock(), int(time.time() * 1000)
        rejected: list[Outcome] = []
        arrivals: dict[str, int] = {}
        tensor_models: set[str] = set()
        aboard = self._aboard
        for delivery in deliveries:
            verdict = self._rejection(delivery)
            if verdict is not None:
                rejected.append(Outcome(delivery, verdict[0], error=verdict[1]))
                continue
            lane = lane_of(delivery)
            arrivals[lane.model] = arrivals.get(lane.model, 0) + 1
            if lane.signature:
                tensor_models.add(lane.model)
            arrived = now
            if riders and delivery.task is not None:
                arrived = now - max(0, now_ms - delivery.task.enqueued_at_ms) / 1000.0
            aboard.board(lane, delivery, arrived, self._due(delivery, now, now_ms))
        for model, count in arrivals.items():
            state = await self.models.refresh(model, tensors=model in tensor_models)
            if not riders:
                state.rate.add(now, count)
        if rejected:
            await self.settle(rejected)
        self.metrics.buffered.set(len(aboard))
        if deliveries:
            self._signals.boarded()

    def _due(self, delivery: Delivery, now: float, now_ms: int) -> float | None:
        """When the boarding task should be answered, on the batcher's clock (None: no
        deadline and no SLO)."""
        task = delivery.task
        assert task is not None  # unreadable tasks never board (``_rejection``)
        due = fate.due_ms(deadline_ms=task.deadline_ms, enqueued_at_ms=task.enqueued_at_ms,
                          slo_ms=self.settings.slo_ms)
        return None if due is None else now + (due - now_ms) / 1000.0

    def _rejection(self, delivery: Delivery) -> tuple[Status, str] | None:
        """A final status for a task that must not board (unreadable, expired, delivered too
        often), with the reason."""
        if delivery.task is None:
            return Status.FAILED, delivery.problem or "unreadable task"
        return fate.before_inference(
            deadline_ms=delivery.task.deadline_ms, now_ms=int(time.time() * 1000),
            deliveries=delivery.deliveries, max_deliveries=self.settings.max_deliveries)
