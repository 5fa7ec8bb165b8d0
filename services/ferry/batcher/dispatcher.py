"""Dispatching: plan with the pure batching policy, send each batch as its own task, keep count
of the batches at Triton, and end boarded tasks that a client cancelled.

A model gets as many batches at Triton at once as Triton runs instances of it over every server
of the pool (or ``max_inflight_batches``), so a batch never queues behind another at Triton nor
waits while an instance idles. With more than one batcher alive, those slots are the whole
fleet's (``budget``): a batch leaves with a slot taken from the shared budget, on the server the
slot names, and a batch that finds none waits, boarding more, for the next. The dispatcher is
the executor's ``BatchContext``: it answers for the models (through the model book) and for the
cancellations it has heard of.

Of what the loops share (``shared.py``) it owns the batches at Triton (``AtTriton``): it
launches them, sees their calls end and lands them. It takes batches from the work aboard and
lets their entries go once answered, and tells the reader's pace (``ReadAhead``) when a batch
leaves or a slot frees.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping

from ferry.batcher.budget import Budget
from ferry.batcher.executor import BatchContext, BatchExecutor, Outcome
from ferry.batcher.models import ModelBook, ModelState
from ferry.batcher.shared import Shared
from ferry.batcher.shared_budget import Slot
from ferry.queue.base import Delivery
from ferry.rules import fate
from ferry.rules.breaker import CircuitBreaker
from ferry.rules.policy import Backend, BatchPolicy, Departure, Lane, Reason
from ferry.settings import BatcherSettings
from ferry.tasks.record import Status
from ferry.telemetry.metrics import BatcherMetrics
from ferry.telemetry.tracing import CURRENT_BATCH, BatchTrace, Tracing, batch_trace
from ferry.triton.pool import ON_ENDPOINT

log = logging.getLogger(__name__)
batches_log = logging.getLogger("ferry.batches")  # a line per batch and call, at DEBUG
MakeExecutor = Callable[[BatchContext], BatchExecutor]  # the executor, with its context


class Dispatcher:
    """Turns the boarded work into batches at Triton, as the policy plans them."""

    def __init__(self, settings: BatcherSettings, metrics: BatcherMetrics, *, shared: Shared,
                 models: ModelBook, policy: BatchPolicy, budget: Budget, tracing: Tracing,
                 make_executor: MakeExecutor) -> None:
        """``make_executor``: the executor that runs each batch, given this dispatcher as its
        context."""
        self.settings = settings
        self.budget = budget
        self.metrics = metrics
        self.models = models
        self.gate = shared.gate
        self.policy = policy
        self.tracing = tracing
        self.clock = shared.clock
        self.executor = make_executor(self)
        # What the loops share, and the model book's states, bound once: used for every batch.
        self._aboard = shared.aboard
        self._at_triton = shared.at_triton  # this dispatcher's own
        self._read_ahead = shared.read_ahead  # the reader's: told a batch left, a slot freed
        self._signals = shared.signals
        self._states = models.states
        self._gap_since: dict[str, float] = {}  # model: when a call of it ended, work waiting
        self._settling: set[asyncio.Task[None]] = set()  # done at Triton, writing results
        self._slots: dict[asyncio.Task[None], Slot] = {}  # each batch's slot in the budget
        self._planning = False  # the loop runs: a round follows its bell

    async def loop(self) -> None:
        """Plan, launch what is due, and sleep until something changes or a batch is due."""
        self._planning = True
        try:
            await self._rounds()
        finally:
            self._planning = False
            self._signals.way_made()  # no round follows: what made way for one goes on

    async def _rounds(self) -> None:
        signals = self._signals
        while True:
            signals.planning()
            draining = signals.stopping
            now = self.clock()
            holding = self.gate.holding()  # Triton is down: hold boarded work until it is back
            backends = self.models.backends(now, holding, self.budget)
            plan = self.policy.plan(self._aboard.views(self.models.lane_capacity), now,
                                    backends, draining=draining)
            self._depart(plan.flush)
            if self.budget.fleet > 1:
                self._queue_up(backends)
            signals.way_made()  # the batches done at Triton go on, after those just launched
            self.metrics.buffered.set(len(self._aboard))
            if draining and (not self._aboard or holding) and signals.fed():
                return  # what is still held when Triton is down is handed back by stop()
            # wake_in 0 means a due batch waits for a free slot: a finishing batch wakes us.
            timeout = None if plan.wake_in == 0 else plan.wake_in
            if not self.gate.is_open:
                timeout = self.settings.read_block_ms / 1000.0  # look again for Triton's return
            await signals.changed(timeout)

    def _depart(self, flush: tuple[Departure, ...]) -> None:
        """Launch each departure that has a slot; ask the shared budget for one for the rest
        (they stay aboard, and board more, until it comes). A slot taken for a model whose
        work did not leave goes back at once: an idle slot held is an instance idle."""
        for departure in flush:
            model = departure.lane.model
            slot = self.budget.slot(model)
            if slot is None:
                self.budget.ask(model, functools.partial(self._aboard.holds, model))
                continue
            self.launch(departure.lane, self._aboard.take(departure.lane, departure.size),
                        departure.reason, slot)
        if self.budget.granted:
            self.budget.unused([m for m, taken in self.budget.granted.items() if taken])

    def _queue_up(self, backends: Mapping[str, Backend]) -> None:
        """With the budget shared with other batchers: offer what boarded here to the fleet's
        one queue, and, under load, wait in it for the next slot that frees anywhere, as a
        free instance takes everything queued at Triton (that slot's batch leaves at once)."""
        models = {lane.model for lane in self._aboard.lanes()}
        riding = self.budget.boarding is not None  # a batch at Triton keeps its slot on
        for model in models:
            backend = backends.get(model)
            if backend is not None and not self.budget.free(model) and not (
                    riding and self.budget.holding(model)) and self.policy.loaded(
                    self.models.lane_capacity(Lane(model)), backend):
                self.budget.ask(model, functools.partial(self._aboard.holds, model))
        self.budget.tend(models)

    def launch(self, lane: Lane, deliveries: list[Delivery], reason: Reason,
               slot: Slot | None = None) -> None:
        """Send a batch as its own task, counted in flight until it is done."""
        recorder = None
        if self.tracing.enabled:
            recorder = batch_trace(lane.model, reason.value, [
                (d.task.trace_context, d.task.enqueued_at_ms) for d in deliveries if d.task])
        task = asyncio.create_task(self._run_batch(lane.model, deliveries, recorder,
                                                   slot.endpoint if slot else ""),
                                   name=f"ferry-batch-{lane.model}")
        self._at_triton.launched(task, lane, deliveries)
        if slot is not None:
            self._slots[task] = slot
        since = self._gap_since.pop(lane.model, None)
        now = self.clock()
        if since is not None:
            self.metrics.dispatch_gap.labels(lane.model).observe(now - since)
        state = self._states.get(lane.model)
        if state is not None:
            state.inflight += 1
            state.freed = False
            self._expect_end(task, lane, state, len(deliveries), now)
        if batches_log.isEnabledFor(logging.DEBUG):
            batches_log.debug("batch at=%.4f model=%s priority=%s size=%d reason=%s gap_ms=%.1f "
                              "left=%d inflight=%d slots=%d due_in_ms=%.1f", now, lane.model,
                              lane.priority.label, len(deliveries), reason.value,
                              (now - since) * 1000 if since is not None else -1.0,
                              len(self._aboard), state.inflight if state else 0,
                              state.slots if state else 0, self._due_in_ms(deliveries))
        self.metrics.flushes.labels(lane.model, reason.value).inc()
        self._read_ahead.batch_left()
        self.metrics.inflight.set(len(self._at_triton) - len(self._settling))
        task.add_done_callback(self._batch_done)

    def _expect_end(self, task: asyncio.Task[None], lane: Lane, state: ModelState, size: int,
                    now: float) -> None:
        """When the batch's call should end: for the shared budget, whose pulls of riders wait
        for the call's last stretch (always); and for a parked reader to read ahead just
        before, only under load (``BatchPolicy.loaded``), where an idle instance costs
        capacity: at light load the read ahead would be a read more per batch for nothing."""
        expected = state.cost.time_at(size)
        slot = self._slots.get(task)
        if slot is not None:
            self.budget.expect(slot, expected)
        backend = state.backend(now, holding=False, fleet=self.budget.fleet)
        if expected > 0 and self.policy.loaded(self.models.lane_capacity(lane), backend):
            self._at_triton.expect_end(task, now + expected)

    def _due_in_ms(self, deliveries: list[Delivery]) -> float:
        """Milliseconds until the batch's most urgent task is due; nan when none is (for the
        batch log)."""
        dues = [due for d in deliveries if d.task is not None
                and (due := fate.due_ms(deadline_ms=d.task.deadline_ms,
                                        enqueued_at_ms=d.task.enqueued_at_ms,
                                        slo_ms=self.settings.slo_ms)) is not None]
        return min(dues) - time.time() * 1000 if dues else math.nan

    async def _run_batch(self, model: str, deliveries: list[Delivery],
                         recorder: BatchTrace | None = None, endpoint: str = "") -> None:
        if endpoint:
            ON_ENDPOINT.set(endpoint)  # this task's own context: the pool sends it there
        if recorder is not None:
            CURRENT_BATCH.set(recorder)  # this task's own context: the executor records in it
        try:
            await self.executor.run(model, deliveries, self._free_slot)
        except Exception:
            log.exception("batch of %d for %s failed; its tasks stay pending for reclaim",
                          len(deliveries), model)
        if recorder is not None:
            recorder.emit(self.tracing.tracer)
        self._aboard.let_go(deliveries)  # not on cancellation: stop() hands those back

    def _free_slot(self) -> Awaitable[None] | None:
        """The current batch is done at Triton: its slot goes to the next batch while its
        results are written and acknowledged (the batch stays held until they are). At most
        as many batches of a model settle at once as it may have at Triton: while Redis is slow
        to take results, batches wait for it rather than pile up answers it cannot take.
        What the batch awaits before it builds its answers, when work of the model waits for
        the slot: the turn of the loop the freed slot woke (``Signals.make_way``)."""
        task = asyncio.current_task()
        at_triton = self._at_triton
        if task is None or task not in at_triton or task in self._settling:
            return None
        at_triton.done_at_triton(task)
        lane = at_triton.lane(task)
        state = self._states.get(lane.model)
        settling = sum(1 for t in self._settling if at_triton.lane(t).model == lane.model)
        if state is not None and settling >= state.window.limit:
            return None  # its slot frees when its results are written
        self._settling.add(task)
        woke = self._release(lane, task)
        if not (woke and self._planning and self._aboard.holds(lane.model)):
            return None
        return self._signals.make_way()

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        lane = self._at_triton.landed(task)
        if task in self._settling:
            self._settling.discard(task)
            self.metrics.inflight.set(len(self._at_triton) - len(self._settling))
        else:
            self._release(lane, task)

    def _release(self, lane: Lane, task: asyncio.Task[None]) -> bool:
        """A slot of the lane's model is free: count it (give it back to the shared budget),
        and wake whoever waits for one, as the reader's pace says; whether a loop was woken."""
        slot = self._slots.pop(task, None)
        if slot is not None:
            self.budget.give(slot)
        state = self._states.get(lane.model)
        if state is not None:
            state.freed = state.inflight >= state.slots  # what waited for it leaves at once
            state.inflight = max(0, state.inflight - 1)
        self.metrics.inflight.set(len(self._at_triton) - len(self._settling))
        if batches_log.isEnabledFor(logging.DEBUG):
            now, reading = self.clock(), self._read_ahead
            ahead = reading.read_ahead_at
            batches_log.debug("free at=%.4f model=%s parked=%s reading_ahead=%s "
                              "read_ahead_ms=%.1f", now, lane.model, reading.parked,
                              reading.reading_ahead,
                              (now - ahead) * 1000 if ahead is not None else -1.0)
        return self._read_ahead.slot_freed()

    # -- cancellation ---------------------------------------------------------------------------

    def on_cancel(self, message: bytes) -> None:
        """A client cancelled a task a batcher holds: if it is boarded here, it ends CANCELLED
        now; if its batch has left, the executor leaves it out of any retry."""
        removed = self._aboard.cancel(message.decode(errors="replace"))
        if removed:
            asyncio.get_running_loop().create_task(self._settle_cancelled(removed))

    async def _settle_cancelled(self, deliveries: list[Delivery]) -> None:
        outcomes = [Outcome(d, Status.CANCELLED, error=fate.CANCELLED) for d in deliveries]
        settled = await self.executor.settle(outcomes)
        self._aboard.cancel_settled(deliveries, settled=settled)
        self.metrics.buffered.set(len(self._aboard))

    # -- the executor's BatchContext -----------------------------------------------------------

    def cancelled(self, delivery: Delivery) -> bool:
        return self._aboard.cancelled(delivery)

    def running(self) -> bool:
        return not self._signals.stopping

    def breaker(self, model: str, version: str = "") -> CircuitBreaker:
        return self.models.breaker(model, version)

    def call_time(self, model: str, size: int) -> float:
        return self.models.call_time(model, size)

    def observe_call(self, model: str, size: int, seconds: float) -> None:
        """A call ended: fit its time; with the model's work waiting, a gap opens until the
        model's next batch leaves (``ferry_dispatch_gap_seconds``)."""
        if batches_log.isEnabledFor(logging.DEBUG):
            batches_log.debug("call at=%.4f model=%s size=%d seconds=%.4f expected=%.4f",
                              self.clock(), model, size, seconds, self.call_time(model, size))
        self.models.observe_call(model, size, seconds)
        if self._aboard.holds(model):
            self._gap_since.setdefault(model, self.clock())
