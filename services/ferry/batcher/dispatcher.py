"""Dispatching: plan with the pure batching policy, send each batch as its own task, keep count
of the batches at Triton, and end boarded tasks that a client cancelled.

A model gets as many batches at Triton at once as Triton runs instances of it over every server
of the pool (or ``max_inflight_batches``), so a batch never queues behind another at Triton nor
waits while an instance idles. With more than one batcher alive, those slots are the whole
fleet's (``budget``): a batch leaves with a slot taken from the shared budget, on the server the
slot names, and a batch that finds none waits, boarding more, for the next. The dispatcher is
the executor's ``BatchContext``: it answers for the models (through the model book) and for the
cancellations it has heard of.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Mapping

from ferry.batcher.budget import Budget, Slot
from ferry.batcher.executor import BatchExecutor, Desk, Outcome, Timing
from ferry.batcher.gate import BackendGate
from ferry.batcher.models import ModelBook, ModelState
from ferry.batcher.shared import Shared, wait
from ferry.queue.base import Delivery
from ferry.rules import fate, readahead
from ferry.rules.breaker import CircuitBreaker
from ferry.rules.policy import Backend, BatchPolicy, Departure, Lane, Reason
from ferry.settings import BatcherSettings
from ferry.tasks.base import BatcherStore
from ferry.tasks.record import Status
from ferry.telemetry.metrics import BatcherMetrics
from ferry.telemetry.tracing import CURRENT_BATCH, BatchTrace, Tracing, batch_trace
from ferry.triton.base import InferenceBackend
from ferry.triton.pool import ON_ENDPOINT

log = logging.getLogger(__name__)
batches_log = logging.getLogger("ferry.batches")  # a line per batch and call, at DEBUG
CANCELLED_MEMORY = 10_000  # cancelled ids remembered for tasks this batcher has not seen


class Dispatcher:
    """Turns the shared buffer into batches at Triton, as the policy plans them."""

    def __init__(self, settings: BatcherSettings, backend: InferenceBackend, store: BatcherStore,
                 metrics: BatcherMetrics, *, shared: Shared, models: ModelBook,
                 gate: BackendGate, policy: BatchPolicy, tracing: Tracing,
                 timing: Timing, budget: Budget, desk: Desk | None = None) -> None:
        self.settings = settings
        self.budget = budget
        self.metrics = metrics
        self.shared = shared
        self.models = models
        self.gate = gate
        self.policy = policy
        self.tracing = tracing
        self.clock = timing.clock
        self.executor = BatchExecutor(settings, backend, store, metrics, gate=gate, context=self,
                                      timing=timing, interfaces=models.interfaces, desk=desk)
        # The same objects as ``shared``'s and ``models``', bound once: used for every batch.
        self._buffer = shared.buffer
        self._batches = shared.batches
        self._held = shared.held
        self._cancelled = shared.cancelled
        self._changed = shared.changed
        self._states = models.states
        self._gap_since: dict[str, float] = {}  # model: when a call of it ended, work waiting
        self._settling: set[asyncio.Task[None]] = set()  # done at Triton, writing results
        self._slots: dict[asyncio.Task[None], Slot] = {}  # each batch's slot in the budget

    async def loop(self) -> None:
        """Plan, launch what is due, and sleep until something changes or a batch is due."""
        while True:
            self._changed.clear()
            draining = self.shared.stopping.is_set()
            now = self.clock()
            holding = self.gate.holding()  # Triton is down: hold boarded work until it is back
            backends = self.models.backends(now, holding, self.budget)
            plan = self.policy.plan(self._buffer.views(self.models.lane_capacity), now,
                                    backends, draining=draining)
            self._depart(plan.flush)
            if self.budget.fleet > 1:
                self._queue_up(backends)
            self.metrics.buffered.set(len(self._buffer))
            if draining and (not self._buffer or holding) and self.shared.feeders_done():
                return  # what is still held when Triton is down is handed back by stop()
            # wake_in 0 means a due batch waits for a free slot: a finishing batch wakes us.
            timeout = None if plan.wake_in == 0 else plan.wake_in
            if not self.gate.is_open:
                timeout = self.settings.read_block_ms / 1000.0  # look again for Triton's return
            await wait(self._changed, timeout)

    def _depart(self, flush: tuple[Departure, ...]) -> None:
        """Launch each departure that has a slot; ask the shared budget for one for the rest
        (they stay aboard, and board more, until it comes). A slot taken for a model whose
        work did not leave goes back at once: an idle slot held is an instance idle."""
        for departure in flush:
            model = departure.lane.model
            slot = self.budget.slot(model)
            if slot is None:
                self.budget.ask(model, functools.partial(self._buffer.holds, model))
                continue
            self.launch(departure.lane, self._buffer.take(departure.lane, departure.size),
                        departure.reason, slot)
        if self.budget.granted:
            self.budget.unused([m for m, taken in self.budget.granted.items() if taken])

    def _queue_up(self, backends: Mapping[str, Backend]) -> None:
        """With the budget shared with other batchers: offer what boarded here to the fleet's
        one queue, and, under load, wait in it for the next slot that frees anywhere, as a
        free instance takes everything queued at Triton (that slot's batch leaves at once)."""
        models = {lane.model for lane in self._buffer.lanes()}
        riding = self.budget.boarding is not None  # a batch at Triton keeps its slot on
        for model in models:
            backend = backends.get(model)
            if backend is not None and not self.budget.free(model) and not (
                    riding and self.budget.holding(model)) and self.policy.loaded(
                    self.models.lane_capacity(Lane(model)), backend):
                self.budget.ask(model, functools.partial(self._buffer.holds, model))
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
        self._batches[task] = (lane, deliveries)
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
                              len(self._buffer), state.inflight if state else 0,
                              state.slots if state else 0, self._due_in_ms(deliveries))
        self.metrics.flushes.labels(lane.model, reason.value).inc()
        self.shared.room_freed.set()
        self.metrics.inflight.set(len(self._batches) - len(self._settling))
        task.add_done_callback(self._batch_done)

    def _expect_end(self, task: asyncio.Task[None], lane: Lane, state: ModelState, size: int,
                    now: float) -> None:
        """When the batch's call should end, for a parked reader to read ahead just before:
        only under load (``BatchPolicy.loaded``), where an idle instance costs capacity; at
        light load the read ahead would be a read more per batch for nothing."""
        expected = state.cost.time_at(size)
        backend = state.backend(now, holding=False, fleet=self.budget.fleet)
        if expected > 0 and self.policy.loaded(self.models.lane_capacity(lane), backend):
            self.shared.ends[task] = now + expected

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
        for delivery in deliveries:  # not on cancellation: stop() hands those back
            self._held.discard(delivery.key)

    def _free_slot(self) -> bool:
        """The current batch is done at Triton: its slot goes to the next batch while its
        results are written and acknowledged (the batch stays held until they are). At most
        as many batches of a model settle at once as it may have at Triton: while Redis is slow
        to take results, batches wait for it rather than pile up answers it cannot take.
        Whether work of the model waits for the slot."""
        task = asyncio.current_task()
        if task is None or task not in self._batches or task in self._settling:
            return False
        self.shared.ends.pop(task, None)
        lane = self._batches[task][0]
        state = self._states.get(lane.model)
        settling = sum(1 for t in self._settling if self._batches[t][0].model == lane.model)
        if state is not None and settling >= state.window.limit:
            return False  # its slot frees when its results are written
        self._settling.add(task)
        self._release(lane, task)
        return self._buffer.holds(lane.model)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        lane, _ = self._batches.pop(task, (Lane(""), []))
        self.shared.ends.pop(task, None)
        if task in self._settling:
            self._settling.discard(task)
            self.metrics.inflight.set(len(self._batches) - len(self._settling))
        else:
            self._release(lane, task)

    def _release(self, lane: Lane, task: asyncio.Task[None]) -> None:
        """A slot of the lane's model is free: count it (give it back to the shared budget),
        and wake whoever waits for one."""
        slot = self._slots.pop(task, None)
        if slot is not None:
            self.budget.give(slot)
        state = self._states.get(lane.model)
        if state is not None:
            state.freed = state.inflight >= state.slots  # what waited for it leaves at once
            state.inflight = max(0, state.inflight - 1)
        self.metrics.inflight.set(len(self._batches) - len(self._settling))
        shared = self.shared
        if batches_log.isEnabledFor(logging.DEBUG):
            now = self.clock()
            ahead = shared.read_ahead_at
            batches_log.debug("free at=%.4f model=%s parked=%s reading_ahead=%s "
                              "read_ahead_ms=%.1f", now, lane.model, shared.parked,
                              shared.reading_ahead,
                              (now - ahead) * 1000 if ahead is not None else -1.0)
        if shared.reading_ahead:
            return  # its boarding wakes the dispatcher, and the reader reads on
        if not shared.parked:
            self._changed.set()
            return
        if readahead.fresh(shared.read_ahead_at, self.clock()):
            self._changed.set()  # what was read ahead leaves now: the dispatcher runs first,
        shared.slot_freed.set()  # then the reader, which catches up if a slot is still free

    # -- cancellation ---------------------------------------------------------------------------

    def on_cancel(self, message: bytes) -> None:
        """A client cancelled a task a batcher holds: if it is boarded here, it ends CANCELLED
        now; if its batch has left, the executor leaves it out of any retry."""
        task_id = message.decode(errors="replace")
        self._cancelled.add(task_id)
        removed = self._buffer.remove(lambda d: d.task is not None and d.task.task_id == task_id)
        if removed:
            asyncio.get_running_loop().create_task(self._settle_cancelled(removed))
        elif len(self._cancelled) > CANCELLED_MEMORY:  # ids of tasks held elsewhere: forget old
            self._cancelled.clear()

    async def _settle_cancelled(self, deliveries: list[Delivery]) -> None:
        outcomes = [Outcome(d, Status.CANCELLED, error=fate.CANCELLED) for d in deliveries]
        settled = await self.executor.settle(outcomes)
        for delivery in deliveries:  # unsettled: no longer kept alive, so a reclaim settles it
            self._held.discard(delivery.key)
            if settled and delivery.task is not None:
                self._cancelled.discard(delivery.task.task_id)
        self.metrics.buffered.set(len(self._buffer))

    # -- the executor's BatchContext -----------------------------------------------------------

    def cancelled(self, delivery: Delivery) -> bool:
        return delivery.task is not None and delivery.task.task_id in self._cancelled

    def running(self) -> bool:
        return not self.shared.stopping.is_set()

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
        if self._buffer.holds(model):
            self._gap_since.setdefault(model, self.clock())
