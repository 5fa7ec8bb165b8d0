"""The batcher worker: one class with ``start()`` and ``stop()``.

Its loops share what ``shared.py`` holds, each piece with one owner: the reader boards work
from the owned partitions (all of them in one XREADGROUP), the claimer adds entries that dead
consumers left behind, the keeper tells Redis that the entries this batcher holds are alive
(``reader.py``); the dispatcher asks the pure batching policy what to send and sends each batch
as its own task (``dispatcher.py``); the reporter publishes capacities and depths
(``reporter.py``). What each knows of a model is in the model book (``models.py``).
``stop()`` is two-phase: stop reading and send what has boarded, give batches
``shutdown_grace_s`` to finish, then cancel; whatever is left unfinished is put back in its
stream as new, for any batcher to take at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

from ferry import keys
from ferry.backoff import backoff_delay
from ferry.batcher.budget import Budget
from ferry.batcher.dispatcher import Dispatcher
from ferry.batcher.executor import REAL_TIME, BatchContext, BatchExecutor, Timing
from ferry.batcher.gate import BackendGate
from ferry.batcher.models import ModelBook, ModelState
from ferry.batcher.reader import Reader
from ferry.batcher.reporter import Reporter
from ferry.batcher.riders import FleetBoarding
from ferry.batcher.served import StatisticsDesk
from ferry.batcher.shared import Rounds, Shared
from ferry.batcher.shared_budget import SharedBudget, capped
from ferry.batcher.versions import VersionDesk
from ferry.batcher.webhooks import WebhookSender
from ferry.compose.batcher import BatcherParts, batcher_parts
from ferry.errors import BackendError, RedisError, RedisUnavailableError
from ferry.queue.base import Delivery
from ferry.redis_conn import check_cluster_mode, lean
from ferry.rules.policy import BatchPolicy
from ferry.settings import BatcherSettings
from ferry.telemetry.http import StatusServer
from ferry.telemetry.metrics import BatcherMetrics
from ferry.triton.base import InferenceBackend

log = logging.getLogger(__name__)


class Batcher:
    """Owns a set of partitions and turns their tasks into batches for Triton."""

    def __init__(self, parts: BatcherParts, *, timing: Timing = REAL_TIME) -> None:
        """Wire the batcher's own pieces around ``parts`` (built by ``ferry.compose``)."""
        settings = self.settings = parts.settings
        self.parts = parts
        self.clock = timing.clock
        self.metrics = parts.metrics
        self.partitions = settings.owned
        self.failed = asyncio.Event()  # a loop died: the process should exit and be restarted
        self._gate = BackendGate(parts.backend, settings.outage_budget_s)
        self._shared = Shared.of(self._gate, timing.clock)
        self._models = ModelBook(settings, parts.backend, parts.metrics)
        policy = BatchPolicy(settings.max_batch, settings.max_wait_ms / 1000.0,
                             adaptive=settings.adaptive_flush, aging_s=settings.priority_aging_s)
        self._budget = self._make_budget(parts, timing, policy)
        self._versions = VersionDesk(settings, parts.hot, parts.store, self.partitions,
                                     parts.metrics)
        self._statistics = StatisticsDesk(parts.hot, self._versions)
        self._dispatcher = Dispatcher(
            settings, parts.metrics, shared=self._shared, models=self._models, policy=policy,
            budget=self._budget, tracing=parts.tracing,
            make_executor=lambda context: self._executor(context, timing))
        self._reader = Reader(
            settings, parts.queue, parts.store, parts.metrics, shared=self._shared,
            models=self._models, settle=self._dispatcher.executor.settle)
        self._reporter = Reporter(
            settings, parts.hot, parts.queue, parts.metrics, consumer=parts.consumer,
            models=self._models, policy=policy, shared=self._shared)
        self._cancels = parts.listen(keys.CANCEL_CHANNEL, self._dispatcher.on_cancel)
        self._bells = parts.listen(keys.BUDGET_CHANNEL, self._budget.ring)  # slots that freed
        self._webhooks = _webhook_sender(settings, parts, self.partitions)
        self._loops: list[asyncio.Task[None]] = []
        self._lease: asyncio.Task[None] | None = None  # its heartbeat: outlives the loops
        self._renewal: asyncio.Task[None] | None = None  # its slots' too
        self._metrics_server: StatusServer | None = None
        self._stopped = False

    def _executor(self, context: BatchContext, timing: Timing) -> BatchExecutor:
        """What runs each batch to its answers, asking ``context`` (the dispatcher)."""
        parts = self.parts
        return BatchExecutor(parts.settings, parts.backend, parts.store, parts.metrics,
                             gate=self._gate, context=context, timing=timing,
                             interfaces=self._models.interfaces, desk=self._statistics)

    def _make_budget(self, parts: BatcherParts, timing: Timing, policy: BatchPolicy) -> Budget:
        """Each model's in-flight budget: its instances over the pool, shared with the other
        batchers through Redis while there are others, with one queue for all of them: what
        waits here rides another's slot (``batcher.budget``, ``batcher.riders``)."""
        settings, models, pool = parts.settings, self._models, parts.backend
        shared = None if settings.inflight_budget == "local" else SharedBudget(
            parts.hot, parts.consumer, lease_ms=settings.lease_ms)

        def limits(model: str) -> dict[str, int]:
            per = settings.batches_per_instance
            found = {endpoint: n * per for endpoint, n in pool.limits(model).items()}
            cap = settings.max_inflight_batches
            if cap:  # the operator's cap on the model's batches: on the whole pool
                found = capped(found, cap)
            return found or {"": models.state(model).window.limit}  # not counted: the pool picks

        def waited(model: str, seconds: float) -> None:
            self.metrics.budget_wait.labels(model).observe(seconds)

        def board(deliveries: Sequence[Delivery]) -> Awaitable[None]:
            return self._reader.board(deliveries, riders=True)  # the reader comes later

        boarding = FleetBoarding(
            self._shared.aboard, self._shared.signals, parts.queue, parts.metrics, board=board,
            capacity=lambda model: policy.limit(models.state(model).capacity))
        return Budget(shared, mode=settings.inflight_budget, limits=limits,
                      wake=self._shared.signals.slots_changed, clock=timing.clock, waited=waited,
                      boarding=boarding if settings.budget_riders else None)

    async def renew_loop(self) -> None:
        """Five times a lease: how many batchers are alive, as the heartbeat counted them (the
        budget is shared while more than one is), and another lease for the slots this
        batcher holds (no Redis call while it holds none)."""
        interval = self.settings.lease_ms / 5000.0
        queue, budget = self.parts.queue, self._budget
        while True:
            try:
                budget.saw(queue.live_batchers(), hold_s=2 * self.settings.lease_ms / 1000.0)
                self.metrics.budget_shared.set(1 if budget.shared else 0)
                await budget.renew()
            except RedisUnavailableError as exc:
                log.warning("renewing the in-flight budget's slots failed: %s", exc)
            await asyncio.sleep(interval)

    @classmethod
    def from_settings(cls, settings: BatcherSettings, *, backend: InferenceBackend | None = None,
                      metrics: BatcherMetrics | None = None, timing: Timing = REAL_TIME
                      ) -> Batcher:
        """A batcher with the parts ``ferry.compose`` builds for the settings (a test's backend
        or metrics registry in place of its own)."""
        return cls(batcher_parts(settings, backend=backend, metrics=metrics), timing=timing)

    # -- what tests and probes may read -----------------------------------------------------------

    @property
    def held_count(self) -> int:
        """Queue entries this batcher holds: boarded, or in a batch at Triton."""
        return self._shared.aboard.held_count

    @property
    def buffered(self) -> int:
        """Tasks boarded and waiting for their batch to leave."""
        return len(self._shared.aboard)

    @property
    def budget(self) -> Budget:
        """Its side of each model's in-flight budget (whether shared, slots taken and held)."""
        return self._budget

    @property
    def backend_reachable(self) -> bool:
        """False during a Triton outage, while reading and dispatch hold."""
        return self._gate.is_open

    @property
    def depth_rounds(self) -> Rounds:
        """The rounds of the loop that measures the owned partitions every claim interval."""
        return self._reporter.depth_rounds

    def model_state(self, model: str) -> ModelState | None:
        """What the batcher knows of ``model`` (None before its first task); not a copy."""
        return self._models.get(model)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, create the consumer groups, start the loops (and /metrics if configured)."""
        self.parts.tracing.start()
        await self.parts.backend.start()
        with contextlib.suppress(BackendError):  # Triton still starting: primed on first sight
            self.metrics.prime(await self.parts.backend.ready_models())
        for partition in self.partitions:  # measured from the first claim interval on
            self.metrics.partition_depth.labels(str(partition))
            self.metrics.partition_pending.labels(str(partition))
        await self._until_redis_answers(self._prepare_queue)
        await self._cancels.start()
        if self._budget.mode != "local":
            await self._bells.start()
        if self._webhooks is not None:
            await self._webhooks.start()
        await self._versions.start()
        await self._statistics.start()
        await self._serve_status()
        self._loops = self._start_loops()
        self._lease = asyncio.create_task(self._reader.lease_loop(), name="ferry-lease")
        self._lease.add_done_callback(self._loop_done)
        self._renewal = asyncio.create_task(self.renew_loop(), name="ferry-budget")
        self._renewal.add_done_callback(self._loop_done)
        s = self.settings
        log.info("batcher %s owns partitions %s; batches of %d or after %.0f ms; infer calls "
                 "over %s", self.parts.consumer, ",".join(map(str, self.partitions)), s.max_batch,
                 s.max_wait_ms, f"HTTP {s.triton_http_url}" if s.triton_http_url
                 else f"gRPC {s.triton_url}")
        log.info("Triton servers: %s; in-flight budget %s, riders %s", ", ".join(
            f"{e.name} {e.state.value}" for e in self.parts.backend.endpoints.values()),
            s.inflight_budget, "on" if s.budget_riders else "off")

    def _start_loops(self) -> list[asyncio.Task[None]]:
        """Every loop as a referenced task; those that may board work are the feeders."""
        reader, reporter = self._reader, self._reporter
        loops: dict[str, Coroutine[Any, Any, None]] = {
            "ferry-reader": reader.read_loop(), "ferry-claimer": reader.claim_loop(),
            "ferry-keeper": reader.keep_loop(), "ferry-dispatcher": self._dispatcher.loop(),
            "ferry-reporter": reporter.report_loop(), "ferry-gauges": reporter.depth_loop()}
        tasks = [asyncio.create_task(loop, name=name) for name, loop in loops.items()]
        self._shared.signals.feeding(t for t in tasks if t.get_name() != "ferry-dispatcher")
        for task in tasks:
            task.add_done_callback(self._loop_done)
        return tasks

    async def _serve_status(self) -> None:
        s = self.settings
        if s.metrics_port:
            self._metrics_server = StatusServer(s.metrics_host, s.metrics_port,
                                                self.metrics.registry, live=self.liveness,
                                                ready=self.readiness)
            await self._metrics_server.start()

    def liveness(self) -> tuple[bool, dict[str, str]]:
        """Alive while every loop runs (a dead loop makes the process exit anyway)."""
        dead = [t.get_name() for t in self._loops if t.done()]
        return (bool(self._loops) and not dead and not self.failed.is_set(),
                {"loops": "running" if not dead else f"stopped: {', '.join(dead)}"})

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """Ready while Redis answered a read lately and Triton is reachable."""
        failures = self._reader.read_failures
        alive, _ = self.liveness()
        details = {"redis": "ok" if not failures else f"{failures} reads failed in a row",
                   "triton": "ok" if self._gate.is_open else "unreachable",
                   "partitions": ",".join(map(str, self.partitions))}
        return alive and not failures and self._gate.is_open, details

    async def _prepare_queue(self) -> None:
        await check_cluster_mode(self.settings, self.parts.hot)
        await self.parts.queue.ensure_groups()

    async def _until_redis_answers(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run a start-up step, waiting out a Redis that is starting (refusing, or loading its
        data) for up to three times ``redis_socket_timeout_s``."""
        deadline = self.clock() + 3 * self.settings.redis_socket_timeout_s
        attempt = 0
        while True:
            try:
                await step()
                return
            except RedisUnavailableError as exc:
                attempt += 1
                if self.clock() >= deadline:
                    raise
                log.warning("Redis is not ready (%s); trying again", exc)
                await asyncio.sleep(backoff_delay(attempt, 0.1, 1.0, jitter=1.0))

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        self._shared.signals.loop_ended()  # the dispatcher sees whether the feeders are done
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
        self._shared.stop()
        grace = self.settings.shutdown_grace_s
        _, pending = await asyncio.wait(self._loops, timeout=grace) if self._loops else ((), ())
        at_triton = self._shared.at_triton
        if len(at_triton) and self._gate.is_open:  # in an outage they only wait: hand them back
            await asyncio.wait(at_triton.tasks(), timeout=max(0.1, grace / 2))
        unfinished = self._shared.unfinished()
        await _cancel([*pending, *at_triton.tasks()], timeout_s=max(0.1, grace / 2))
        await self._release(unfinished)
        await self._close()

    async def _release(self, deliveries: list[Delivery]) -> None:
        """Hand unfinished work back as new entries (delivery count 1) for others to take now."""
        if not deliveries:
            return
        try:
            await self.parts.queue.release(deliveries)
            log.info("handed %d unfinished task(s) back to the queue", len(deliveries))
        except RedisError as exc:
            log.warning("could not hand back %d task(s) (%s); they will be reclaimed after "
                        "%d ms", len(deliveries), exc, self.settings.claim_idle_ms)

    async def _close(self) -> None:
        parts = self.parts
        await self._budget.close()
        if self._renewal is not None:
            await _cancel([self._renewal], timeout_s=1.0)
        await self._cancels.stop()
        await self._bells.stop()
        await self._versions.stop()
        await self._statistics.stop()
        if self._webhooks is not None:
            await self._webhooks.stop()
        with contextlib.suppress(RedisError):
            await self._reporter.withdraw()
        if self._metrics_server is not None:
            await self._metrics_server.close()
            self._metrics_server = None
        await self._gate.close()
        await parts.backend.close()
        await parts.queue.close()  # no read in flight may land after the consumer is forgotten
        if self._lease is not None:  # renewed until now: nothing it held was taken over
            await _cancel([self._lease], timeout_s=1.0)
        with contextlib.suppress(RedisError):
            await parts.queue.forget_consumer()
        if parts.hand_off is not None:  # the last batches' log records, before the connection
            await parts.hand_off.close()
        await parts.hot.close()
        parts.tracing.shutdown()

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


async def _cancel(tasks: Iterable[asyncio.Task[None]], timeout_s: float) -> None:
    """Cancel the tasks and wait up to ``timeout_s`` for them to end."""
    cancelled = list(tasks)
    for task in cancelled:
        task.cancel()
    if cancelled:
        _, stuck = await asyncio.wait(cancelled, timeout=timeout_s)
        for task in stuck:  # ignored its cancellation: leave it, the process is ending
            log.error("%s did not stop when cancelled", task.get_name())


def _webhook_sender(settings: BatcherSettings, parts: BatcherParts,
                    partitions: Sequence[int]) -> WebhookSender | None:
    """The sender of the webhooks of ``partitions``, when webhooks are on: its blocking reads
    on a connection of their own (on a Redis Cluster it polls, through the shared client)."""
    if not settings.webhook_hosts:
        return None
    reader = None if settings.redis_cluster else lean(settings,
                                                      f"ferry-webhooks-{parts.consumer}")
    return WebhookSender(settings, parts.hot, partitions, parts.consumer, parts.metrics,
                         reader=reader)
