"""The batcher worker: one class with ``start()`` and ``stop()``.

Tasks share a boarding buffer: the reader fills it from the owned partitions (all of them in one
XREADGROUP), the claimer adds entries that dead consumers left behind, the keeper tells Redis that
the entries this batcher holds are alive, and the dispatcher asks the pure batching policy what to
send and sends each batch as its own task. A model gets as many batches at Triton at once as
Triton runs instances of it (or ``max_inflight_batches``), so a batch never queues behind another
at Triton nor waits while an instance idles; the policy learns each model's arrival rate and call
cost to leave early when the backend is idle and nobody else is coming.
``stop()`` is two-phase: stop reading and send what has boarded, give batches
``shutdown_grace_s`` to finish, then cancel; whatever is left unfinished is put back in its
stream as new, for any batcher to take at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from ferry.backoff import backoff_delay
from ferry.batcher.executor import BatchExecutor, Outcome
from ferry.batcher.gate import BackendGate
from ferry.batcher.webhooks import WebhookSender
from ferry.batching import fate
from ferry.batching.breaker import BreakerState, CircuitBreaker
from ferry.batching.buffer import BoardingBuffer
from ferry.batching.estimators import ArrivalRate, BatchCost, Window, service_rate
from ferry.batching.policy import Backend, BatchPolicy, Lane, Reason
from ferry.compose import BatcherParts, batcher_parts
from ferry.errors import BackendError
from ferry.priority import BY_URGENCY, Priority
from ferry.queue.base import Delivery
from ferry.redis_conn import REDIS_UNAVAILABLE, check_cluster_mode
from ferry.settings import BatcherSettings, parse_partitions
from ferry.tasks import capacity
from ferry.tasks.capacity import Capacity
from ferry.tasks.record import Status
from ferry.telemetry.http import StatusServer
from ferry.telemetry.metrics import BatcherMetrics
from ferry.telemetry.tracing import CURRENT_BATCH, BatchTrace, batch_trace
from ferry.triton.base import InferenceBackend

log = logging.getLogger(__name__)
PARK_MIN_S = 0.005
CANCELLED_MEMORY = 10_000  # cancelled ids remembered for tasks this batcher has not seen


def lane_of(delivery: Delivery) -> Lane:
    """The boarding lane: the model and priority, alone for a task delivered before."""
    assert delivery.task is not None
    return Lane(delivery.task.model, Priority.of(delivery.task.priority),
                suspect=delivery.deliveries > 1)


@dataclass
class ModelState:
    """What the dispatcher knows about one model: batch limit, instances, load, call cost, the
    window of batches Triton is given at once, and the model's circuit breaker."""

    capacity: int
    window: Window  # batches that may be at Triton at once (at most the instances)
    breaker: CircuitBreaker
    inflight: int = 0
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    cost: BatchCost = field(default_factory=BatchCost)

    @property
    def slots(self) -> int:
        return self.window.allowed

    def backend(self, now: float, holding: bool) -> Backend:
        free = 0 if holding else max(0, self.slots - self.inflight)
        return Backend(free=free, rate=self.rate.at(now), fixed_s=self.cost.fixed_s)


class Batcher:
    """Owns a set of partitions and turns their tasks into batches for Triton."""

    def __init__(
        self,
        settings: BatcherSettings,
        *,
        backend: InferenceBackend | None = None,
        metrics: BatcherMetrics | None = None,
        parts: BatcherParts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.parts = parts or batcher_parts(settings, backend=backend, metrics=metrics)
        self.settings = settings
        self.clock = clock
        self.metrics = self.parts.metrics
        self.policy = BatchPolicy(settings.max_batch, settings.max_wait_ms / 1000.0,
                                  adaptive=settings.adaptive_flush,
                                  aging_s=settings.priority_aging_s)
        self.partitions = parse_partitions(settings.owned_partitions, settings.partitions)
        self.backend = self.parts.backend
        self.queue = self.parts.queue
        self.gate = BackendGate(self.backend, settings.outage_budget_s)
        self.consumer = self.parts.consumer
        self.fallbacks = settings.fallbacks()
        self._cancelled: set[str] = set()  # ids a client cancelled, that this batcher may hold
        self.cancels = self.parts.cancels
        self.tracing = self.parts.tracing
        self.cancels.on_message = self._on_cancel
        self.webhooks = (WebhookSender(settings, self.parts.redis, self.partitions,
                                       self.consumer, self.metrics)
                         if settings.webhook_hosts else None)
        self.executor = BatchExecutor(settings, self.backend, self.parts.store, self.metrics,
                                      gate=self.gate, observe_call=self._observe_call,
                                      breakers=self._breaker, fallbacks=self.fallbacks,
                                      clock=clock, call_time=self._call_time,
                                      cancelled=self._is_cancelled)
        self.buffer: BoardingBuffer[Delivery] = BoardingBuffer()
        self.failed = asyncio.Event()  # a loop died: the process should exit and be restarted
        self.models: dict[str, ModelState] = {}
        self._held: set[tuple[str, str]] = set()  # (stream, entry id) in the buffer or at Triton
        self._batches: dict[asyncio.Task[None], tuple[Lane, list[Delivery]]] = {}
        self._changed = asyncio.Event()
        self._slot_freed = asyncio.Event()  # wakes a parked reader
        self._room_freed = asyncio.Event()  # a batch left: the buffer has room again
        self._parked = False
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._metrics_server: StatusServer | None = None
        self._read_failures = 0  # queue reads failed in a row (Redis unreachable)
        self._stopped = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, create the consumer groups, start the loops (and /metrics if configured)."""
        s = self.settings
        self.tracing.start()
        await self.backend.start()
        await self._until_redis_answers(self._prepare_queue)
        await self.cancels.start()
        if self.webhooks is not None:
            await self.webhooks.start()
        if s.metrics_port:
            self._metrics_server = StatusServer(s.metrics_host, s.metrics_port,
                                                self.metrics.registry, live=self.liveness,
                                                ready=self.readiness)
            await self._metrics_server.start()
        self._loops = [
            asyncio.create_task(self._read_loop(), name="ferry-reader"),
            asyncio.create_task(self._claim_loop(), name="ferry-claimer"),
            asyncio.create_task(self._keep_loop(), name="ferry-keeper"),
            asyncio.create_task(self._dispatch_loop(), name="ferry-dispatcher"),
            asyncio.create_task(self._report_loop(), name="ferry-reporter"),
        ]
        for loop_task in self._loops:
            loop_task.add_done_callback(self._loop_done)
        log.info("batcher %s owns partitions %s; batches of %d or after %.0f ms",
                 self.consumer, ",".join(map(str, self.partitions)), s.max_batch, s.max_wait_ms)

    def liveness(self) -> tuple[bool, dict[str, str]]:
        """Alive while every loop runs (a dead loop makes the process exit anyway)."""
        dead = [t.get_name() for t in self._loops if t.done()]
        return (bool(self._loops) and not dead and not self.failed.is_set(),
                {"loops": "running" if not dead else f"stopped: {', '.join(dead)}"})

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """Ready while Redis answered a read lately and Triton is reachable."""
        redis_ok = self._read_failures == 0
        alive, _ = self.liveness()
        details = {"redis": "ok" if redis_ok else f"{self._read_failures} reads failed in a row",
                   "triton": "ok" if self.gate.is_open else "unreachable",
                   "partitions": ",".join(map(str, self.partitions))}
        return alive and redis_ok and self.gate.is_open, details

    async def _prepare_queue(self) -> None:
        await check_cluster_mode(self.settings, self.parts.redis)
        await self.queue.ensure_groups()

    async def _until_redis_answers(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run a start-up step, waiting out a Redis that is starting (refusing, or loading its
        data) for up to three times ``redis_socket_timeout_s``."""
        deadline = self.clock() + 3 * self.settings.redis_socket_timeout_s
        attempt = 0
        while True:
            try:
                await step()
                return
            except REDIS_UNAVAILABLE as exc:
                attempt += 1
                if self.clock() >= deadline:
                    raise
                log.warning("Redis is not ready (%s); trying again", exc)
                await asyncio.sleep(backoff_delay(attempt, 0.1, 1.0, jitter=1.0))

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        self._changed.set()  # the dispatcher re-checks whether the reader is done
        if not task.cancelled() and task.exception() is not None:
            log.error("%s died: %r; the batcher stops", task.get_name(), task.exception())
            self.failed.set()

    async def stop(self) -> None:
        """Stop reading, send what has boarded, wait for batches, then cancel. Idempotent.

        Takes at most ``shutdown_grace_s`` for the loops, half of it again for batches, and a
        bounded wait for what was cancelled.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self._changed.set()
        self._slot_freed.set()
        self._room_freed.set()
        grace = self.settings.shutdown_grace_s
        _, pending = await asyncio.wait(self._loops, timeout=grace) if self._loops else ((), ())
        if self._batches and self.gate.is_open:  # in an outage they only wait: hand them back
            await asyncio.wait(list(self._batches), timeout=max(0.1, grace / 2))
        unfinished = [d for task, (_, batch) in self._batches.items() if not task.done()
                      for d in batch]
        unfinished += self.buffer.drain()
        cancelled = [*pending, *self._batches]
        for task in cancelled:
            task.cancel()
        if cancelled:
            _, stuck = await asyncio.wait(cancelled, timeout=max(0.1, grace / 2))
            for task in stuck:  # ignored its cancellation: leave it, the process is ending
                log.error("%s did not stop when cancelled", task.get_name())
        await self._release(unfinished)
        await self._close()

    async def _release(self, deliveries: list[Delivery]) -> None:
        """Hand unfinished work back as new entries (delivery count 1) for others to take now."""
        if not deliveries:
            return
        try:
            await self.queue.release(deliveries)
            log.info("handed %d unfinished task(s) back to the queue", len(deliveries))
        except REDIS_UNAVAILABLE as exc:
            log.warning("could not hand back %d task(s) (%s); they will be reclaimed after "
                        "%d ms", len(deliveries), exc, self.settings.claim_idle_ms)

    async def _close(self) -> None:
        await self.cancels.stop()
        if self.webhooks is not None:
            await self.webhooks.stop()
        with contextlib.suppress(*REDIS_UNAVAILABLE):
            await capacity.withdraw(self.parts.hot, self.consumer, list(self.models))
        if self._metrics_server is not None:
            await self._metrics_server.close()
            self._metrics_server = None
        await self.gate.close()
        await self.backend.close()
        await self.queue.close()  # no read in flight may land after the consumer is forgotten
        with contextlib.suppress(*REDIS_UNAVAILABLE):
            await self.queue.forget_consumer()
        await self.parts.hot.close()
        await self.parts.redis.aclose()
        self.tracing.shutdown()

    async def run(self) -> int:
        """Run until SIGINT or SIGTERM (0) or until a loop dies (1), then stop cleanly."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, wake.set)
        await self.start()
        waits = [asyncio.create_task(wake.wait()), asyncio.create_task(self.failed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
            log.info("batcher stopping")
            await self.stop()
        return 1 if self.failed.is_set() else 0

    # -- reading --------------------------------------------------------------------------------

    @property
    def quota(self) -> int:
        """Tasks of one priority that may wait in the buffer: a batch per slot, and one more."""
        slots = sum(m.slots for m in self.models.values()) or 1
        return self.settings.max_batch * (slots + 1)

    def rooms(self) -> dict[Priority, int]:
        """Room per priority: each has its own quota, so that waiting low-priority work never
        stops high-priority work from being read."""
        waiting = self.buffer.count_by(lambda lane: lane.priority)
        return {p: self.quota - waiting.get(p, 0) for p in BY_URGENCY}

    @property
    def room(self) -> int:
        """How many more tasks may board (of the priority with the most room)."""
        return max(self.rooms().values())

    async def _read_loop(self) -> None:
        """Read while a batch could leave; while every slot is busy, park and catch up later.

        A blocking read returns as soon as one entry arrives, so reading on while the backend
        is busy costs a round trip per task and helps no batch leave sooner. Parked, the reader
        waits for a slot to free (at most ``max_wait_ms / 4``), then takes everything that has
        arrived in one read, and only then does the dispatcher plan: batches are as full and as
        fresh as if it had read all along.
        """
        per_stream = max(1, math.ceil(self.settings.max_batch / len(self.partitions)))
        block_s = self.settings.read_block_ms / 1000.0
        while not self._stopping.is_set():
            rooms = self.rooms()
            awake = self.queue.awake(self._holding(), poll=True)
            readable = [p for p in awake if rooms[p] > 0]
            if not readable or not self.gate.is_open:  # full, or Triton is down: leave it queued
                await self._wait_changed(block_s)
                continue
            block_ms = self.settings.read_block_ms
            caught_up = self._backend_busy()
            if caught_up:
                await self._park()
                block_ms = 0  # catch up without blocking: the dispatcher is waiting for this read
            partial = len(readable) < len(awake)
            if partial:  # a blocked read would not see the full priority's room free: poll
                block_ms = 0
                self._room_freed.clear()
            count = min(per_stream, *(rooms[p] for p in readable))
            try:
                deliveries = await self.queue.read(count, block_ms, readable)
                self._read_failures = 0
            except REDIS_UNAVAILABLE as exc:
                self._read_failures += 1
                self._changed.set()  # whatever waited for this read plans without it
                log.warning("reading the queue failed (%s); retrying", exc)
                await asyncio.sleep(backoff_delay(self._read_failures + 1, 0.1, 2.0, jitter=1.0))
                continue
            await self._board(deliveries)
            if partial and not deliveries:  # until a batch leaves (or a moment passes)
                await _wait(self._room_freed, block_s)
            if caught_up:
                self._changed.set()  # a slot may have freed: the dispatcher plans again

    def _holding(self) -> set[Priority]:
        """Priorities of the tasks this batcher holds (boarded, or at Triton)."""
        held = set(self.buffer.count_by(lambda lane: lane.priority))
        held.update(lane.priority for lane, _ in self._batches.values())
        return held

    def _backend_busy(self) -> bool:
        """Every model this batcher knows has all its slots taken."""
        return bool(self.models) and all(m.inflight >= m.slots for m in self.models.values())

    async def _park(self) -> None:
        """Until a slot frees, or a quarter of the max wait (at least ``PARK_MIN_S``: reading
        less must not become polling)."""
        self._parked = True
        self._slot_freed.clear()
        await _wait(self._slot_freed, max(PARK_MIN_S, self.settings.max_wait_ms / 4000.0))
        self._parked = False

    async def _claim_loop(self) -> None:
        interval = self.settings.claim_interval_ms / 1000.0
        while not await self._stop_within(interval):
            try:
                await self._reclaim()
                self.metrics.queue_depth.set(await self.queue.depth())
                for partition, (depth, held) in (await self.queue.partition_stats()).items():
                    self.metrics.partition_depth.labels(str(partition)).set(depth)
                    self.metrics.partition_pending.labels(str(partition)).set(held)
                await self.parts.store.heal_backlog(self.partitions)
            except REDIS_UNAVAILABLE as exc:
                log.warning("reclaiming idle tasks failed: %s", exc)

    async def _report_loop(self) -> None:
        """Publish each model's measured capacity every second, for the gateways' admission."""
        while not await self._stop_within(capacity.REPORT_INTERVAL_S):
            try:
                await capacity.report(self.parts.hot, self.consumer, self.capacities(),
                                      time.time())
            except REDIS_UNAVAILABLE as exc:
                log.warning("reporting capacity failed: %s", exc)

    def capacities(self) -> dict[str, Capacity]:
        """What each model this batcher has called can serve (full batches on every slot), and
        its circuit breaker's state."""
        now = self.clock()
        measured: dict[str, Capacity] = {}
        for name, state in self.models.items():
            batch = self.policy.limit(state.capacity)
            rate = service_rate(state.cost, state.slots, batch)
            breaker = state.breaker.state(now)
            self.metrics.circuit.labels(name).set(breaker.gauge)
            if rate > 0 or breaker is not BreakerState.CLOSED:
                measured[name] = Capacity(rate, state.cost.mean_s, breaker.value,
                                          self.fallbacks.of(name) or "",
                                          state.breaker.retry_after(now))
        return measured

    async def _keep_loop(self) -> None:
        """Reset the idle time of held entries, well within ``claim_idle_ms``, on its own timer."""
        interval = max(0.05, self.settings.claim_idle_ms / 3000.0)
        while not await self._stop_within(interval):
            try:
                await self.queue.touch(list(self._held))
            except REDIS_UNAVAILABLE as exc:
                log.warning("refreshing held tasks failed: %s", exc)

    async def _stop_within(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; whether the batcher is stopping."""
        return await _wait(self._stopping, seconds)

    async def _reclaim(self) -> None:
        """Take over tasks that dead consumers left, as many as there is room for."""
        if self.room <= 0 or not self.gate.is_open:
            return
        per_stream = max(1, self.room // len(self.partitions))
        claimed = await self.queue.claim_stale(self.settings.claim_idle_ms, per_stream)
        fresh = [d for d in claimed if (d.stream, d.entry_id) not in self._held]
        flags = await self.parts.store.cancel_requested(
            [d.task.task_id if d.task else "" for d in fresh])
        self._cancelled.update(d.task.task_id for d, flag in zip(fresh, flags, strict=True)
                               if flag and d.task is not None)
        if fresh:
            log.info("reclaimed %d idle task(s)", len(fresh))
            self.metrics.reclaimed.inc(len(fresh))
            await self._board(fresh)

    async def _board(self, deliveries: Sequence[Delivery]) -> None:
        """Put readable tasks in the buffer; settle unreadable or over-delivered ones at once."""
        now = self.clock()
        rejected: list[Outcome] = []
        arrivals: dict[str, int] = {}
        for delivery in deliveries:
            verdict = self._rejection(delivery)
            if verdict is not None:
                rejected.append(Outcome(delivery, verdict[0], error=verdict[1]))
                continue
            lane = lane_of(delivery)
            arrivals[lane.model] = arrivals.get(lane.model, 0) + 1
            self._held.add(delivery.key)
            self.buffer.add(lane, delivery, now)
        for model, count in arrivals.items():
            (await self._model(model)).rate.add(now, count)
        if rejected:
            await self.executor.settle(rejected)
        self.metrics.buffered.set(len(self.buffer))
        if deliveries:
            self._changed.set()

    def _rejection(self, delivery: Delivery) -> tuple[Status, str] | None:
        """A final status for a task that must not board (unreadable, expired, delivered too
        often), with the reason."""
        if delivery.task is None:
            return Status.FAILED, delivery.problem or "unreadable task"
        return fate.before_inference(
            deadline_ms=delivery.task.deadline_ms, now_ms=int(time.time() * 1000),
            deliveries=delivery.deliveries, max_deliveries=self.settings.max_deliveries)

    async def _model(self, model: str) -> ModelState:
        """The model's state, its batch limit and instance count refreshed from Triton's config
        (cached by the backend)."""
        state = self._state(model)
        try:
            spec = await self.backend.model_spec(model)
        except BackendError:  # the executor reports it with the batch; chunking still applies
            return state
        state.capacity = spec.max_batch_size
        state.window.resize(self.settings.max_inflight_batches or spec.instances)
        return state

    def _state(self, model: str) -> ModelState:
        state = self.models.get(model)
        if state is None:
            s = self.settings
            breaker = CircuitBreaker(s.breaker_threshold, s.breaker_window_s,
                                     s.breaker_min_calls, s.breaker_cooldown_s)
            state = self.models[model] = ModelState(
                s.max_batch, Window(s.max_inflight_batches or 1), breaker)
        return state

    def _call_time(self, model: str, size: int) -> float:
        state = self.models.get(model)
        return state.cost.time_at(size) if state is not None else 0.0

    def _breaker(self, model: str) -> CircuitBreaker:
        return self._state(model).breaker

    def _lane_capacity(self, lane: Lane) -> int:
        """Suspects go one at a time; a model's lane takes what the model takes."""
        if lane.suspect:
            return 1
        state = self.models.get(lane.model)
        return state.capacity if state else self.settings.max_batch

    def _observe_call(self, model: str, size: int, seconds: float) -> None:
        state = self.models.get(model)
        if state is not None:
            state.window.observe(seconds, state.cost.time_at(size) if state.cost.settled else 0.0)
            state.cost.add(size, seconds)
            self.metrics.window.labels(model).set(state.slots)

    # -- cancellation ---------------------------------------------------------------------------

    def _on_cancel(self, message: bytes) -> None:
        """A client cancelled a task a batcher holds: if it is boarded here, it ends CANCELLED
        now; if its batch has left, the executor leaves it out of any retry."""
        task_id = message.decode(errors="replace")
        self._cancelled.add(task_id)
        removed = self.buffer.remove(lambda d: d.task is not None and d.task.task_id == task_id)
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
        self.metrics.buffered.set(len(self.buffer))

    def _is_cancelled(self, delivery: Delivery) -> bool:
        return delivery.task is not None and delivery.task.task_id in self._cancelled

    # -- dispatching ----------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            self._changed.clear()
            draining = self._stopping.is_set()
            now = self.clock()
            holding = self.gate.holding()  # Triton is down: hold boarded work until it is back
            backends = {name: m.backend(now, holding) for name, m in self.models.items()}
            plan = self.policy.plan(self.buffer.views(self._lane_capacity), now, backends,
                                    draining=draining)
            for departure in plan.flush:
                self._launch(departure.lane, self.buffer.take(departure.lane, departure.size),
                             departure.reason)
            self.metrics.buffered.set(len(self.buffer))
            if draining and (not self.buffer or holding) and self._reader_done():
                return  # what is still held when Triton is down is handed back by stop()
            # wake_in 0 means a due batch waits for a free slot: a finishing batch wakes us.
            timeout = None if plan.wake_in == 0 else plan.wake_in
            if not self.gate.is_open:
                timeout = self.settings.read_block_ms / 1000.0  # look again for Triton's return
            await self._wait_changed(timeout)

    def _reader_done(self) -> bool:
        return all(t.done() for t in self._loops if t.get_name() != "ferry-dispatcher")

    async def _wait_changed(self, timeout: float | None) -> None:
        await _wait(self._changed, timeout)

    def _launch(self, lane: Lane, deliveries: list[Delivery], reason: Reason) -> None:
        recorder = None
        if self.tracing.enabled:
            recorder = batch_trace(lane.model, reason.value, [
                (d.task.trace_context, d.task.enqueued_at_ms) for d in deliveries if d.task])
        task = asyncio.create_task(self._run_batch(lane.model, deliveries, recorder),
                                   name=f"ferry-batch-{lane.model}")
        self._batches[task] = (lane, deliveries)
        state = self.models.get(lane.model)
        if state is not None:
            state.inflight += 1
        self.metrics.flushes.labels(lane.model, reason.value).inc()
        self._room_freed.set()
        self.metrics.inflight.set(len(self._batches))
        task.add_done_callback(self._batch_done)

    async def _run_batch(self, model: str, deliveries: list[Delivery],
                         recorder: BatchTrace | None = None) -> None:
        if recorder is not None:
            CURRENT_BATCH.set(recorder)  # this task's own context: the executor records in it
        try:
            await self.executor.run(model, deliveries)
        except Exception:
            log.exception("batch of %d for %s failed; its tasks stay pending for reclaim",
                          len(deliveries), model)
        if recorder is not None:
            recorder.emit(self.tracing.tracer)
        for delivery in deliveries:  # not on cancellation: stop() hands those back
            self._held.discard(delivery.key)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        lane, _ = self._batches.pop(task, (Lane(""), []))
        model = lane.model
        state = self.models.get(model)
        if state is not None:
            state.inflight = max(0, state.inflight - 1)
        self.metrics.inflight.set(len(self._batches))
        if self._parked:
            self._slot_freed.set()  # the reader catches up, then boarding wakes the dispatcher
        else:
            self._changed.set()


async def _wait(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait for ``event`` up to ``timeout_s`` (None: for ever); whether it is set.

    ``asyncio.timeout`` costs a timer, where ``wait_for`` also costs a task: this is on the
    dispatcher's path for every batch. It always yields once, so that a loop waiting on an event
    that is already set still lets the task that will clear it run.
    """
    if event.is_set():
        await asyncio.sleep(0)
    else:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
    return event.is_set()
