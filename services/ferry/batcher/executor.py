"""Running one batch to a final answer for every request in it.

While Triton cannot be reached at all, a batch waits for it (up to ``outage_budget_s``) and the
batcher reads no new work: an outage is not the requests' fault and uses none of their attempts.
Other transient failures (overloaded, timed out) retry the whole batch with backoff. A permanent
failure of a batch of several splits it in halves until the request that causes it is alone, so
its batch-mates still succeed. A request that fails ``max_attempts`` times is FAILED with the last
error and copied to its partition's dead-letter stream. Results, dead letters and acknowledgements
are written by one script per partition: a crash before it re-runs the task, never loses it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from ferry.backoff import backoff_delay
from ferry.batcher.gate import BackendGate
from ferry.batcher.models import Interfaces
from ferry.batcher.tensor_batch import answers, joined_inputs, rows_of
from ferry.codec import outputs_to_json
from ferry.errors import (
    BackendError,
    ModelContractError,
    RedisConnectionError,
    RedisUnavailableError,
    UnknownModelError,
)
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.rules import fate
from ferry.rules.breaker import CircuitBreaker
from ferry.rules.fate import Failure, Fate
from ferry.rules.rows import row_chunks
from ferry.settings import BatcherSettings
from ferry.tasks.base import BatcherStore, Completion
from ferry.tasks.record import Status, TaskRecord, dead_letter, reusable
from ferry.telemetry.metrics import BatcherMetrics
from ferry.telemetry.tracing import CURRENT_BATCH
from ferry.triton.base import InferenceBackend, ModelSpec
from ferry.usage import ledger
from ferry.usage.labels import ClientLabels
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
T = TypeVar("T")


class Answered(Protocol):
    @property
    def model_version(self) -> str: ...


V = TypeVar("V", bound=Answered)


@dataclass(frozen=True)
class Outcome:
    """The final answer for one delivery."""

    delivery: Delivery
    status: Status
    output: Any = None
    error: str | None = None
    model_version: str = ""
    answered_by: str | None = None  # the fallback model that answered, if not the task's own
    infer_s: float = 0.0  # its batch's Triton call (0: it did not reach Triton)
    rows: int = 0  # the rows of that call
    task_rows: int = 0  # its own rows in that call
    gpu_us: int = 0  # its share of that call's time, by its rows (``usage.ledger.shares_us``)
    review: Any = None  # a cascade's review entry (``batcher.reviews``)

    def record(self, finished_at: float) -> TaskRecord | None:
        task = self.delivery.task
        if task is None:
            return None
        return TaskRecord.final(task, self.status, finished_at, output=self.output,
                                error=self.error,
                                model_version=self.model_version or task.model_version,
                                answered_by=self.answered_by, review=self.review)

    def completion(self, finished_at: float) -> Completion:
        """Its record, its dead letter and whether its answer may be cached, by the record's
        rules (``ferry.tasks.record``)."""
        task = self.delivery.task
        letter = dead_letter(task, self.status, self.error, self.delivery.problem)
        return Completion(self.delivery, self.record(finished_at), letter, self._reusable(),
                          rows=self.task_rows, gpu_us=self.gpu_us)

    def _reusable(self) -> bool:
        return reusable(self.delivery.task, self.status, self.model_version, self.answered_by)


def _version_of(items: Sequence[Delivery], model: str) -> str:
    """The version a one-BYTES batch asks of ``model``: its tasks' (a lane holds one version;
    none of a fallback model)."""
    first = items[0].task
    return first.model_version if first is not None and first.model == model else ""


def in_time(outcome: Outcome, finished_at: float) -> Outcome:
    """The outcome as its record may be written at ``finished_at``: a success that came after
    its task's deadline is EXPIRED, its answer dropped (what the call cost is still charged)."""
    task = outcome.delivery.task
    if outcome.status is not Status.SUCCESS or task is None or not task.deadline_ms:
        return outcome
    late = fate.after_inference(deadline_ms=task.deadline_ms, finished_at=finished_at)
    if late is None:
        return outcome
    return replace(outcome, status=Status.EXPIRED, output=None, error=late, answered_by=None,
                   review=None)


def failed(deliveries: Sequence[Delivery], error: str) -> list[Outcome]:
    return [Outcome(d, Status.FAILED, error=error) for d in deliveries]


def tensor_tasks(items: Sequence[Delivery]) -> list[Task] | None:
    """The batch's tasks when it is a tensor batch (its tasks carry ``inputs``), else None."""
    first = items[0].task
    if first is None or not first.inputs:
        return None
    return [d.task for d in items if d.task is not None]


# Frees the batch's slot; what to await before its answers are built (None: nothing).
Freed = Callable[[], Awaitable[None] | None]


class Release:
    """The running batch's slot at Triton, freed once Triton is done with the batch: as soon as
    its one whole call (of ``size`` tasks) returns, before its answers are built; after a split
    or a retry, once every call is over. Each batch makes its own and hands it down its calls."""

    __slots__ = ("_free", "_size")

    def __init__(self, free: Freed | None, size: int) -> None:
        self._free = free
        self._size = size

    async def done_at_triton(self, count: int) -> None:
        """A call of ``count`` tasks is over: if it is the batch's whole call, free the slot
        (once), and when the freed slot woke a loop that work waits for, let that loop take its
        turn before the answers are built (the next batch sends its call, or the reader its
        read: building a large batch's answers takes milliseconds, and the freed instance
        would idle that long)."""
        free = self._free
        if free is None or count != self._size:
            return
        self._free = None
        way = free()
        if way is not None:
            await way


@dataclass(frozen=True)
class Timing:
    """The executor's clock, sleep and jitter: real ones, or a test's."""

    clock: Callable[[], float] = time.monotonic
    sleep: Sleep = asyncio.sleep
    jitter: Callable[[], float] = random.random


REAL_TIME = Timing()


class BatchContext(Protocol):
    """What the executor asks of the batcher that runs it about its models and tasks."""

    def breaker(self, model: str, version: str = "") -> CircuitBreaker:
        """The circuit breaker of the model's version ('': the version Triton's policy picks):
        one per version, so a failing candidate never stops its stable version's calls."""
        ...

    def call_time(self, model: str, size: int) -> float:
        """The fitted time of a call of ``size`` to the model (0: not known yet)."""
        ...

    def observe_call(self, model: str, size: int, seconds: float) -> None:
        """A call of ``size`` to the model succeeded in ``seconds``."""
        ...

    def cancelled(self, delivery: Delivery) -> bool:
        """Whether a client cancelled the delivery's task."""
        ...

    def running(self) -> bool:
        """Whether the batcher goes on (False once it stops: work is handed back)."""
        ...


class Desk(Protocol):
    """What settling a batch tells the batcher's version desk (``batcher.versions``)."""

    async def prepare(self, outcomes: Sequence[Outcome]) -> Sequence[Outcome]:
        """The outcomes as their records are to be written (a review entry added)."""
        ...

    def settled(self, outcomes: Sequence[Outcome], finished_at: float) -> None:
        """Outcomes just written (each new)."""
        ...


class Standalone:
    """A context of the executor's own, for an executor that runs outside a batcher: breakers
    made on first use, nothing fitted, nothing cancelled."""

    def __init__(self) -> None:
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}

    def breaker(self, model: str, version: str = "") -> CircuitBreaker:
        breaker = self._breakers.get((model, version))
        if breaker is None:
            breaker = self._breakers[(model, version)] = CircuitBreaker()
        return breaker

    def call_time(self, model: str, size: int) -> float:
        return 0.0

    def observe_call(self, model: str, size: int, seconds: float) -> None:
        return None

    def running(self) -> bool:
        return True

    def cancelled(self, delivery: Delivery) -> bool:
        return False


class BatchExecutor:
    """Infers, isolates, retries, then settles: results, dead letters, acknowledgements."""

    def __init__(self, settings: BatcherSettings, backend: InferenceBackend, store: BatcherStore,
                 metrics: BatcherMetrics, *, gate: BackendGate,
                 context: BatchContext | None = None, timing: Timing = REAL_TIME,
                 interfaces: Interfaces | None = None, desk: Desk | None = None) -> None:
        """``desk`` sees every batch it ends (versions' figures, the cascade; None: nothing)."""
        self.settings = settings
        self.backend = backend
        self.interfaces = interfaces or Interfaces(backend)
        self.store = store
        self.metrics = metrics
        self.gate = gate
        self.context = context or Standalone()
        self.fallbacks = settings.fallbacks
        # Bound once: each is called per batch or per delivery.
        self.breaker = self.context.breaker
        self.call_time = self.context.call_time
        self.observe_call = self.context.observe_call
        self.cancelled = self.context.cancelled
        self.clock = timing.clock
        self.sleep = timing.sleep
        self.jitter = timing.jitter
        self.desk = desk
        # the per-client metrics' labels: the clients that cost the most, the rest 'other'
        self.clients = ClientLabels(settings.client_labels, self.clock())

    async def run(self, model: str, deliveries: Sequence[Delivery],
                  inferred: Freed | None = None) -> None:
        """Give every delivery a final status and settle it; ``inferred`` is called once Triton
        is done with the batch (its slot is free then: as soon as its one whole call returns,
        before the answers are built; after a split or a retry, once every call is over), and
        gives what to await before the answers are built (the next batch is let go first)."""
        live, outcomes = self.unwanted(deliveries, model)
        self._observe_wait(model, live)
        release = Release(inferred, len(live))
        if live:
            outcomes += await self._attempt(model, live, 1, release)
        await release.done_at_triton(len(live))
        await self.settle(outcomes)

    def unwanted(self, deliveries: Sequence[Delivery], model: str = ""
                 ) -> tuple[list[Delivery], list[Outcome]]:
        """Split off the tasks that must not reach Triton (expired, or would be before the call
        ends; cancelled) with their final outcome; the rest go on."""
        now_ms = int(time.time() * 1000)
        call_ms = int(self.call_time(model, len(deliveries)) * 1000) if model else 0
        live: list[Delivery] = []
        ended: list[Outcome] = []
        for d in deliveries:
            verdict = fate.before_inference(deadline_ms=d.task.deadline_ms if d.task else 0,
                                            now_ms=now_ms, call_ms=call_ms,
                                            cancelled=self.cancelled(d))
            if verdict is None:
                live.append(d)
            else:
                ended.append(Outcome(d, verdict[0], error=verdict[1]))
        return live, ended

    async def _attempt(self, model: str, items: Sequence[Delivery], attempt: int,
                       release: Release, *, fallback: bool = True) -> list[Outcome]:
        version = _version_of(items, model)
        breaker = self.breaker(model, version)
        if not breaker.allow(self.clock()):
            return await self._circuit_open(model, version, items, attempt, release,
                                            fallback=fallback)
        try:
            tasks = tensor_tasks(items)
            if tasks is not None:
                interface = (await self.interfaces.get(model, version)).interface
                chunks = row_chunks([rows_of(t, interface.batched) for t in tasks],
                                    interface.max_batch_size)
                if len(chunks) > 1:  # too many rows for one call: each run of them its own
                    breaker.abandon()
                    return await self._gather(model, [items[c.start:c.stop] for c in chunks],
                                              attempt, release)
                outcomes = await self._infer_tensors(model, version, interface.batched, items,
                                                     tasks, release=release)
            else:
                spec = await self.backend.model_spec(model)
                if len(items) > spec.max_batch_size:
                    breaker.abandon()
                    return await self._split(model, items, attempt, spec.max_batch_size,
                                             release)
                outcomes = await self._infer(spec, items, version, release)
        except BackendError as exc:
            return await self._recover(model, version, items, attempt, exc, release=release)
        breaker.record(self.clock(), ok=True)
        return outcomes

    async def _circuit_open(self, model: str, version: str, items: Sequence[Delivery],
                            attempt: int, release: Release, *, fallback: bool
                            ) -> list[Outcome]:
        """The version's breaker refuses calls: the model's fallback answers, or the tasks fail
        fast."""
        other = self.fallbacks.of(model) if fallback else None
        if other is not None:
            outcomes = await self._attempt(other, items, attempt, release, fallback=False)
            return [replace(o, answered_by=other) if o.status is Status.SUCCESS else o
                    for o in outcomes]
        breaker, now = self.breaker(model, version), self.clock()
        named = f"model {model!r}" + (f" version {version}" if version else "")
        return failed(items, f"circuit open for {named}: {breaker.error_rate(now):.0%} "
                      f"of its calls failed in the last {breaker.window_s:g} s; calls resume in "
                      f"{breaker.retry_after(now):.0f} s, and no fallback model is configured")

    async def _classify(self, exc: BackendError) -> Failure:
        """The kind of failure (asking Triton whether it is live for a transient one)."""
        if isinstance(exc, ModelContractError):
            return Failure.CONTRACT
        if exc.transient:
            return Failure.TRANSIENT if await self.backend.server_live() else Failure.UNREACHABLE
        if isinstance(exc, UnknownModelError):
            return Failure.UNKNOWN_MODEL
        return Failure.PERMANENT

    async def _recover(self, model: str, version: str, items: Sequence[Delivery], attempt: int,
                       exc: BackendError, *, release: Release) -> list[Outcome]:
        """Carry out the fate the pure rules give the batch after ``exc``."""
        failure = await self._classify(exc)
        if failure is not Failure.CONTRACT:
            kind = "transient" if exc.transient else "permanent"
            self.metrics.infer_failures.labels(model, kind).inc()
        at = fate.Attempt(len(items), attempt, self.settings.max_attempts)
        decision = fate.after_failure(failure, at)
        breaker = self.breaker(model, version)
        if fate.counts_against_model(failure, decision):
            breaker.record(self.clock(), ok=False)
        else:
            breaker.abandon()  # an outage, or a batch split to find its bad request
        if decision is Fate.WAIT:
            self.gate.close_for_outage(str(exc))
            if await self.gate.wait_open():
                return await self._again(model, items, attempt, release)
            return failed(items, f"Triton unreachable for {self.gate.budget_s:g} s: {exc}")
        if decision is Fate.SPLIT:
            return await self._split(model, items, attempt, (len(items) + 1) // 2, release)
        if decision is Fate.RETRY:
            await self.sleep(backoff_delay(attempt, self.settings.backoff_base_ms / 1000.0,
                                           self.settings.backoff_max_ms / 1000.0, self.jitter()))
            return await self._again(model, items, attempt + 1, release)
        if failure is Failure.CONTRACT:
            return failed(items, str(exc))
        log.warning("giving up on %d task(s) of %s after %d attempts: %s",
                    len(items), model, attempt, exc)
        return failed(items, f"failed after {attempt} attempt(s): {exc}")

    async def _again(self, model: str, items: Sequence[Delivery], attempt: int,
                     release: Release) -> list[Outcome]:
        """Another call for the batch, without the tasks that expired (or were cancelled) while
        it waited."""
        live, ended = self.unwanted(items, model)
        if live:
            ended += await self._attempt(model, live, attempt, release)
        return ended

    async def _infer(self, spec: ModelSpec, items: Sequence[Delivery], version: str,
                     release: Release) -> list[Outcome]:
        payloads = [d.task.payload if d.task else b"" for d in items]
        inferred, seconds = await self._timed(spec.name, len(items),
                                              self.backend.infer(spec, payloads, version))
        await release.done_at_triton(len(items))
        shares = ledger.shares_us(seconds, [1] * len(items))
        return [Outcome(d, Status.SUCCESS, output=outputs_to_json(row),
                        model_version=inferred.model_version, infer_s=seconds, rows=len(items),
                        task_rows=1, gpu_us=share)
                for d, row, share in zip(items, inferred.rows, shares, strict=True)]

    async def _infer_tensors(self, model: str, version: str, batched: bool,
                             items: Sequence[Delivery], tasks: Sequence[Task], *,
                             release: Release) -> list[Outcome]:
        """One call with the tasks' inputs joined; each task answered with its rows."""
        request_id = tasks[0].request_id if len(tasks) == 1 else ""
        call = self.backend.infer_tensors(model, version, joined_inputs(tasks, batched),
                                          list(tasks[0].outputs), request_id)
        each = [rows_of(task, batched) for task in tasks]
        rows = sum(each)  # Triton's batch: what it costs
        inferred, seconds = await self._timed(model, rows, call)
        await release.done_at_triton(len(items))
        shares = ledger.shares_us(seconds, each)
        return [Outcome(d, Status.SUCCESS, output=answer, model_version=inferred.model_version,
                        infer_s=seconds, rows=rows, task_rows=own, gpu_us=share)
                for d, answer, own, share in zip(items, answers(inferred.outputs, tasks, batched),
                                                 each, shares, strict=True)]

    async def _timed(self, model: str, size: int, call: Awaitable[V]) -> tuple[V, float]:
        """The call's answer and its seconds; its time traced, fitted and measured (by the
        version that answered), its failure traced."""
        started, recorder = time.monotonic(), CURRENT_BATCH.get()
        started_ns = time.time_ns() if recorder is not None else 0
        try:
            answer = await call
        except BackendError as exc:
            if recorder is not None:
                recorder.step("triton.infer", started_ns, {
                    "ferry.model": model, "ferry.batch.size": size,
                    "error.type": type(exc).__name__})
            raise
        seconds = time.monotonic() - started
        if recorder is not None:
            recorder.step("triton.infer", started_ns, {"ferry.model": model,
                                                        "ferry.batch.size": size})
        self.observe_call(model, size, seconds)
        self.metrics.observe_call(model, answer.model_version, size, seconds)
        return answer, seconds

    async def _split(self, model: str, items: Sequence[Delivery], attempt: int, size: int,
                     release: Release) -> list[Outcome]:
        return await self._gather(model, [items[i:i + size] for i in range(0, len(items), size)],
                                  attempt, release)

    async def _gather(self, model: str, chunks: Sequence[Sequence[Delivery]], attempt: int,
                      release: Release) -> list[Outcome]:
        """Each chunk attempted as its own call, at once (none is the batch's whole call: the
        slot frees once all are over)."""
        parts = await asyncio.gather(*(self._attempt(model, c, attempt, release)
                                       for c in chunks))
        return [outcome for part in parts for outcome in part]

    async def settle(self, outcomes: Sequence[Outcome]) -> bool:
        """Write results and dead letters and acknowledge, in one round trip; False if Redis
        would not. Unsettled entries stay pending in their stream, and a batcher reclaims them.

        A duplicate delivery whose task already has a final answer writes nothing and leaves no
        dead letter: the first answer stands.
        """
        finished_at, recorder = time.time(), CURRENT_BATCH.get()
        started_ns = time.time_ns() if recorder is not None else 0
        outcomes = [in_time(o, finished_at) for o in outcomes]
        if self.desk is not None:
            outcomes = await self.desk.prepare(outcomes)
        completions = [o.completion(finished_at) for o in outcomes]
        attempt = failures = 0
        while failures < self.settings.max_attempts:
            attempt += 1
            try:
                written = await self.store.complete(completions)
            except RedisUnavailableError as exc:
                failures += self._settle_failed(exc, len(outcomes), attempt)
                await self.sleep(backoff_delay(min(attempt, 8), 0.1, 2.0, self.jitter()))
                continue
            settled = [o for o, new in zip(outcomes, written, strict=True) if new]
            self._count(settled)
            self._charge(settled)
            if self.desk is not None:
                self.desk.settled(settled, finished_at)
            if recorder is not None:
                recorder.step("ferry.result_write", started_ns,
                              {"ferry.tasks": len(outcomes), "ferry.attempt": attempt})
            return True
        return False

    def _settle_failed(self, exc: RedisUnavailableError, tasks: int, attempt: int) -> int:
        """Count a failed write of results; 1 if it counts against ``max_attempts`` (only once
        the batcher stops: then its tasks are handed back). A refusal (out of memory, a replica,
        loading...) or a lost connection (a failover under way) is tried again for as long as
        the batcher runs: the answers are kept, and Triton is not asked again. Writing them
        twice is harmless: a task's first final record stands."""
        reason = "connection" if isinstance(exc, RedisConnectionError) else exc.code
        self.metrics.settle_retries.labels(reason).inc()
        if attempt == 1 or attempt % 20 == 0:
            log.warning("could not settle %d task(s) (try %d): %s", tasks, attempt, exc)
        return 0 if self.context.running() else 1

    def _count(self, settled: Sequence[Outcome]) -> None:
        finished = self.metrics.finished_child
        for outcome in settled:
            task = outcome.delivery.task
            model, version = (task.model, outcome.model_version or task.model_version) \
                if task else ("", "")
            finished(model, outcome.status.value, version).inc()
            if outcome.status is Status.FAILED:
                self.metrics.dead_lettered.inc()

    def _charge(self, settled: Sequence[Outcome]) -> None:
        """What each task cost its client, in the per-client metrics (the ledger in Redis
        counted it as its record was written)."""
        labels, metrics = self.clients, self.metrics
        labels.refresh(self.clock())
        tasks: dict[tuple[str, str], int] = {}  # one increment per client and model a batch
        gpu_us: dict[tuple[str, str], int] = {}
        for outcome in settled:
            task = outcome.delivery.task
            if task is None:
                continue
            client = ledger.client_of(task)
            key = (labels.label(client), task.model)
            tasks[key] = tasks.get(key, 0) + 1
            if outcome.gpu_us:
                labels.charge(client, outcome.gpu_us / 1_000_000)
                gpu_us[key] = gpu_us.get(key, 0) + outcome.gpu_us
        for key, count in tasks.items():
            metrics.client_tasks_child(*key).inc(count)
        for key, used in gpu_us.items():
            metrics.client_gpu_child(*key).inc(used / 1_000_000)

    def _observe_wait(self, model: str, items: Sequence[Delivery]) -> None:
        now_ms = int(time.time() * 1000)
        waits, client_waits = self.metrics.queue_wait_child, self.metrics.client_wait_child
        for delivery in items:
            task = delivery.task
            if task is not None:
                waited = max(0, now_ms - task.enqueued_at_ms) / 1000.0
                waits(model, task.model_version).observe(waited)
                client_waits(self.clients.label(ledger.client_of(task)),
                             Priority.of(task.priority).label).observe(waited)
