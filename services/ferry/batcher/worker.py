"""The batcher worker: one class with ``start()`` and ``stop()``.

Tasks share a boarding buffer: the reader fills it from the owned partitions (all of them in one
XREADGROUP), the claimer adds entries that dead consumers left behind, the keeper tells Redis that
the entries this batcher holds are alive, and the dispatcher asks the pure batching policy what to
send and sends each batch as its own task, at most ``max_inflight_batches`` at a time.
``stop()`` is two-phase: stop reading and send what has boarded, give batches
``shutdown_grace_s`` to finish, then cancel; whatever is left unfinished is put back in its
stream as new, for any batcher to take at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import start_http_server
from redis.exceptions import RedisError

from ferry.backoff import backoff_delay
from ferry.batcher.executor import BatchExecutor, Outcome
from ferry.batcher.gate import BackendGate
from ferry.batching.buffer import BoardingBuffer
from ferry.batching.policy import BatchPolicy
from ferry.errors import BackendError
from ferry.queue.base import Delivery
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import connect
from ferry.results.base import Status
from ferry.results.redis_store import RedisResultStore
from ferry.settings import BatcherSettings, parse_partitions
from ferry.telemetry.metrics import BatcherMetrics
from ferry.triton.base import InferenceBackend
from ferry.triton.grpc_backend import TritonGrpcBackend

log = logging.getLogger(__name__)


def consumer_name() -> str:
    """Unique per process, readable in XINFO CONSUMERS."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


SUSPECT = "#suspect"  # lane suffix: reclaimed tasks that may have crashed a batcher go alone


def lane_of(delivery: Delivery) -> str:
    """The boarding lane: the model, or its one-at-a-time lane for a task delivered before."""
    assert delivery.task is not None
    return delivery.task.model + (SUSPECT if delivery.deliveries > 1 else "")


class Batcher:
    """Owns a set of partitions and turns their tasks into batches for Triton."""

    def __init__(
        self,
        settings: BatcherSettings,
        *,
        backend: InferenceBackend | None = None,
        metrics: BatcherMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = metrics or BatcherMetrics()
        self.policy = BatchPolicy(settings.max_batch, settings.max_wait_ms / 1000.0)
        self.partitions = parse_partitions(settings.owned_partitions, settings.partitions)
        self.backend: InferenceBackend = backend or TritonGrpcBackend(
            settings.triton_grpc_target, infer_timeout_s=settings.infer_timeout_s)
        self.gate = BackendGate(self.backend, settings.outage_budget_s)
        self.consumer = consumer_name()
        self.buffer: BoardingBuffer[Delivery] = BoardingBuffer()
        self.failed = asyncio.Event()  # a loop died: the process should exit and be restarted
        self._redis: aioredis.Redis | None = None
        self._capacity: dict[str, int] = {}
        self._held: set[tuple[str, str]] = set()  # (stream, entry id) in the buffer or at Triton
        self._batches: dict[asyncio.Task[None], list[Delivery]] = {}
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._metrics_server: Any = None
        self._stopped = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, create the consumer groups, start the loops (and /metrics if configured)."""
        s = self.settings
        self._redis = connect(s)
        self.queue = RedisStreamQueue(
            self._redis, partitions=s.partitions, owned=self.partitions, consumer=self.consumer,
            dead_letter_maxlen=s.dead_letter_maxlen)
        self.results = RedisResultStore(self._redis, s.result_ttl_s, s.dead_letter_maxlen)
        self.executor = BatchExecutor(s, self.backend, self.queue, self.results, self.metrics,
                                      gate=self.gate)
        await self.backend.start()
        await self.queue.ensure_groups()
        if s.metrics_port:
            self._metrics_server, _ = start_http_server(
                s.metrics_port, s.metrics_host, registry=self.metrics.registry)
        self._loops = [
            asyncio.create_task(self._read_loop(), name="ferry-reader"),
            asyncio.create_task(self._claim_loop(), name="ferry-claimer"),
            asyncio.create_task(self._keep_loop(), name="ferry-keeper"),
            asyncio.create_task(self._dispatch_loop(), name="ferry-dispatcher"),
        ]
        for loop_task in self._loops:
            loop_task.add_done_callback(self._loop_done)
        log.info("batcher %s owns partitions %s; batches of %d or after %.0f ms",
                 self.consumer, ",".join(map(str, self.partitions)), s.max_batch, s.max_wait_ms)

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        self._changed.set()  # the dispatcher re-checks whether the reader is done
        if not task.cancelled() and task.exception() is not None:
            log.error("%s died: %r; the batcher stops", task.get_name(), task.exception())
            self.failed.set()

    async def stop(self) -> None:
        """Stop reading, send what has boarded, wait for batches, then cancel. Idempotent.

        Takes at most ``shutdown_grace_s`` for the loops and half of it again for batches.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self._changed.set()
        grace = self.settings.shutdown_grace_s
        _, pending = await asyncio.wait(self._loops, timeout=grace) if self._loops else ((), ())
        if self._batches and self.gate.is_open:  # in an outage they only wait: hand them back
            await asyncio.wait(list(self._batches), timeout=max(0.1, grace / 2))
        unfinished = [d for task, batch in self._batches.items() if not task.done() for d in batch]
        unfinished += self.buffer.drain()
        for task in [*pending, *self._batches]:
            task.cancel()
        await asyncio.gather(*pending, *self._batches, return_exceptions=True)
        await self._release(unfinished)
        await self._close()

    async def _release(self, deliveries: list[Delivery]) -> None:
        """Hand unfinished work back as new entries (delivery count 1) for others to take now."""
        if not deliveries or self._redis is None:
            return
        try:
            await self.queue.release(deliveries)
            log.info("handed %d unfinished task(s) back to the queue", len(deliveries))
        except (RedisError, OSError) as exc:
            log.warning("could not hand back %d task(s) (%s); they will be reclaimed after "
                        "%d ms", len(deliveries), exc, self.settings.claim_idle_ms)

    async def _close(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        await self.gate.close()
        await self.backend.close()
        if self._redis is not None:
            with contextlib.suppress(RedisError, OSError):
                await self.queue.forget_consumer()
            await self._redis.aclose()
            self._redis = None

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
    def room(self) -> int:
        """How many more tasks may board before reading pauses."""
        return self.settings.max_batch * (self.settings.max_inflight_batches + 1) - len(self.buffer)

    async def _read_loop(self) -> None:
        per_stream = max(1, math.ceil(self.settings.max_batch / len(self.partitions)))
        block_s = self.settings.read_block_ms / 1000.0
        failures = 0
        while not self._stopping.is_set():
            if self.room <= 0 or not self.gate.is_open:  # full, or Triton is down: leave it queued
                await self._wait_changed(block_s)
                continue
            try:
                deliveries = await self.queue.read(min(self.room, per_stream),
                                                   self.settings.read_block_ms)
                failures = 0
            except (RedisError, OSError) as exc:
                failures += 1
                log.warning("reading the queue failed (%s); retrying", exc)
                await asyncio.sleep(backoff_delay(failures + 1, 0.1, 2.0, jitter=1.0))
                continue
            await self._board(deliveries)

    async def _claim_loop(self) -> None:
        interval = self.settings.claim_interval_ms / 1000.0
        while not await self._stop_within(interval):
            try:
                await self._reclaim()
                self.metrics.queue_depth.set(await self.queue.depth())
            except (RedisError, OSError) as exc:
                log.warning("reclaiming idle tasks failed: %s", exc)

    async def _keep_loop(self) -> None:
        """Reset the idle time of held entries, well within ``claim_idle_ms``, on its own timer."""
        interval = max(0.05, self.settings.claim_idle_ms / 3000.0)
        while not await self._stop_within(interval):
            try:
                await self.queue.touch(list(self._held))
            except (RedisError, OSError) as exc:
                log.warning("refreshing held tasks failed: %s", exc)

    async def _stop_within(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; whether the batcher is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return self._stopping.is_set()

    async def _reclaim(self) -> None:
        """Take over tasks that dead consumers left, as many as there is room for."""
        if self.room <= 0 or not self.gate.is_open:
            return
        per_stream = max(1, self.room // len(self.partitions))
        claimed = await self.queue.claim_stale(self.settings.claim_idle_ms, per_stream)
        fresh = [d for d in claimed if (d.stream, d.entry_id) not in self._held]
        if fresh:
            log.info("reclaimed %d idle task(s)", len(fresh))
            self.metrics.reclaimed.inc(len(fresh))
            await self._board(fresh)

    async def _board(self, deliveries: Sequence[Delivery]) -> None:
        """Put readable tasks in the buffer; settle unreadable or over-delivered ones at once."""
        now = self.clock()
        rejected: list[Outcome] = []
        for delivery in deliveries:
            problem = self._rejection(delivery)
            if problem:
                rejected.append(Outcome(delivery, Status.FAILED, error=problem))
                continue
            assert delivery.task is not None
            await self._learn_capacity(delivery.task.model)
            self._held.add((delivery.stream, delivery.entry_id))
            self.buffer.add(lane_of(delivery), delivery, now)
        if rejected:
            await self.executor.settle(rejected)
        self.metrics.buffered.set(len(self.buffer))
        self._changed.set()

    def _rejection(self, delivery: Delivery) -> str:
        if delivery.task is None:
            return delivery.problem or "unreadable task"
        if delivery.deliveries > self.settings.max_deliveries:
            return (f"delivered {delivery.deliveries} times without finishing "
                    f"(limit {self.settings.max_deliveries}); a batcher may crash on it")
        return ""

    async def _learn_capacity(self, model: str) -> None:
        if model in self._capacity:
            return
        # On failure the executor reports the error with the batch; chunking still applies there.
        with contextlib.suppress(BackendError):
            self._capacity[model] = (await self.backend.model_spec(model)).max_batch_size

    def _lane_capacity(self, lane: str) -> int:
        """Suspects go one at a time; a model's lane takes what the model takes."""
        if lane.endswith(SUSPECT):
            return 1
        return self._capacity.get(lane, self.settings.max_batch)

    # -- dispatching ----------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            self._changed.clear()
            draining = self._stopping.is_set()
            now = math.inf if draining else self.clock()  # draining: every queue is due
            free = self.settings.max_inflight_batches - len(self._batches)
            if self.gate.holding():
                free = 0  # Triton is down: hold boarded work (released if we stop) until it is back
            plan = self.policy.plan(self.buffer.views(self._lane_capacity), now, free)
            for lane, size in plan.flush:
                self._launch(lane, self.buffer.take(lane, size))
            self.metrics.buffered.set(len(self.buffer))
            if draining and (not self.buffer or self.gate.holding()) and self._reader_done():
                return  # what is still held when Triton is down is handed back by stop()
            # wake_in 0 means a due batch waits for a free slot: a finishing batch wakes us.
            timeout = None if plan.wake_in == 0 else plan.wake_in
            if not self.gate.is_open:
                timeout = self.settings.read_block_ms / 1000.0  # look again for Triton's return
            await self._wait_changed(timeout)

    def _reader_done(self) -> bool:
        return all(t.done() for t in self._loops if t.get_name() != "ferry-dispatcher")

    async def _wait_changed(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def _launch(self, lane: str, deliveries: list[Delivery]) -> None:
        task = asyncio.create_task(self._run_batch(deliveries), name=f"ferry-batch-{lane}")
        self._batches[task] = deliveries
        self.metrics.inflight.set(len(self._batches))
        task.add_done_callback(self._batch_done)

    async def _run_batch(self, deliveries: list[Delivery]) -> None:
        model = deliveries[0].task.model if deliveries[0].task else ""
        try:
            await self.executor.run(model, deliveries)
        except Exception:
            log.exception("batch of %d for %s failed; its tasks stay pending for reclaim",
                          len(deliveries), model)
        for delivery in deliveries:  # not on cancellation: stop() hands those back
            self._held.discard((delivery.stream, delivery.entry_id))

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._batches.pop(task, None)
        self.metrics.inflight.set(len(self._batches))
        self._changed.set()
