"""The executor against its seams, without servers: a backend, a store, a ``BatchContext`` and a
``Timing`` of the test's own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from ferry.batcher.executor import BatchExecutor, Standalone, Timing
from ferry.batcher.gate import BackendGate
from ferry.errors import TransientBackendError
from ferry.queue.base import Delivery
from ferry.rules.breaker import CircuitBreaker
from ferry.settings import BatcherSettings
from ferry.tasks.base import Completion
from ferry.tasks.record import Status
from ferry.telemetry.metrics import BatcherMetrics
from ferry.tensors import Tensor
from ferry.triton.base import Inferred, ModelSpec
from ferry.triton.oip import InferredTensors
from ferry.v1.task_pb2 import Task

SPEC = ModelSpec(name="m", version="1", input_name="INPUT", outputs=("OUTPUT",),
                 max_batch_size=8)


class Backend:
    """Answers every payload with itself, after ``failures`` transient failures."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[list[bytes]] = []
        self.tensor_calls: list[list[tuple[int, ...]]] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def server_ready(self) -> bool:
        return True

    async def server_live(self) -> bool:
        return True

    async def ready_models(self) -> list[str]:
        return ["m"]

    async def model_spec(self, model: str, *, refresh: bool = False) -> ModelSpec:
        return SPEC

    async def server_metadata(self) -> dict[str, Any]:
        return {"name": "stand-in", "version": "0", "extensions": []}

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return {"name": model}

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return {"name": model, "max_batch_size": SPEC.max_batch_size}

    async def model_ready(self, model: str, version: str = "") -> bool:
        return model == "m"

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        return {"model_stats": []}

    async def infer_tensors(self, model: str, version: str, inputs: Sequence[Tensor],
                            outputs: Sequence[str] = (), request_id: str = ""
                            ) -> InferredTensors:
        """Answers each input as an output of the same rows (``OUT_<name>``)."""
        self.tensor_calls.append([t.shape for t in inputs])
        return InferredTensors(tuple(Tensor(f"OUT_{t.name}", t.datatype, t.shape, t.raw)
                                     for t in inputs), "1")

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes],
                    version: str = "") -> Inferred:
        self.calls.append(list(payloads))
        if self.failures:
            self.failures -= 1
            raise TransientBackendError("overloaded")
        return Inferred(rows=[{"OUTPUT": [p]} for p in payloads], model_version="1")


class Store:
    def __init__(self) -> None:
        self.completed: list[Completion] = []

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        self.completed += completions
        return [True] * len(completions)


class Context(Standalone):
    """Remembers the good calls; cancels the tasks it is told to."""

    def __init__(self, cancelled: set[str]) -> None:
        super().__init__()
        self.cancelled_ids = cancelled
        self.calls: list[tuple[str, int]] = []

    def observe_call(self, model: str, size: int, seconds: float) -> None:
        self.calls.append((model, size))

    def cancelled(self, delivery: Delivery) -> bool:
        return delivery.task is not None and delivery.task.task_id in self.cancelled_ids


def deliveries(count: int) -> list[Delivery]:
    return [Delivery(0, "s", f"{i}-0", b"", Task(task_id=f"t{i}", model="m",
                                                  payload=f"p{i}".encode()))
            for i in range(count)]


def executor(backend: Backend, store: Store, context: Standalone,
             slept: list[float] | None = None) -> BatchExecutor:
    async def sleep(seconds: float) -> None:
        (slept if slept is not None else []).append(seconds)

    settings = BatcherSettings(backoff_base_ms=10.0, backoff_max_ms=50.0)
    return BatchExecutor(settings, backend, store, BatcherMetrics(),  # type: ignore[arg-type]
                         gate=BackendGate(backend, 1.0), context=context,
                         timing=Timing(sleep=sleep, jitter=lambda: 0.5))


def test_cancelled_tasks_never_reach_the_backend_and_good_calls_are_reported() -> None:
    backend, store, context = Backend(), Store(), Context({"t1"})
    asyncio.run(executor(backend, store, context).run("m", deliveries(3)))
    assert backend.calls == [[b"p0", b"p2"]]
    assert context.calls == [("m", 2)]
    statuses = {c.delivery.task.task_id: c.record.status for c in store.completed
                if c.delivery.task and c.record}
    assert statuses == {"t0": Status.SUCCESS, "t1": Status.CANCELLED, "t2": Status.SUCCESS}


def test_a_transient_failure_retries_after_the_timings_sleep() -> None:
    backend, store, slept = Backend(failures=1), Store(), list[float]()
    context = Context(set())
    asyncio.run(executor(backend, store, context, slept).run("m", deliveries(2)))
    assert len(backend.calls) == 2 and len(slept) == 1 and 0 < slept[0] <= 0.05
    assert [c.record.status for c in store.completed if c.record] == [Status.SUCCESS] * 2
    breaker: CircuitBreaker = context.breaker("m")
    assert breaker is context.breaker("m")  # the context's own, asked by model


class Row(dict[str, Any]):
    """A row of outputs that notes when the executor builds its answer from it."""

    def __init__(self, log: list[str], **outputs: Any) -> None:
        super().__init__(**outputs)
        self.log = log

    def items(self) -> Any:
        self.log.append("answer built")
        return super().items()


class Watched(Backend):
    """Records whether the batch's slot was free by the time each call was made, and when the
    answers were built from its rows (in ``freed``, the test's log)."""

    def __init__(self, freed: list[str], failures: int = 0) -> None:
        super().__init__(failures)
        self.freed = freed
        self.free_at_call: list[bool] = []

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes],
                    version: str = "") -> Inferred:
        self.free_at_call.append(any(line.startswith("freed") for line in self.freed))
        inferred = await super().infer(spec, payloads)
        return Inferred([Row(self.freed, **row) for row in inferred.rows], "1")


def test_the_slot_frees_once_when_the_whole_call_returns_before_any_answer_is_written() -> None:
    freed: list[str] = []
    store = Store()

    async def way() -> None:
        freed.append("way made")

    def free() -> Awaitable[None]:
        freed.append(f"freed with {len(store.completed)} written")
        return way()  # work waits: the executor awaits the turn of the loop the slot woke

    backend = Watched(freed)
    asyncio.run(executor(backend, store, Context(set())).run("m", deliveries(3), free))
    assert freed == ["freed with 0 written", "way made"] + ["answer built"] * 3
    assert backend.free_at_call == [False]
    assert len(store.completed) == 3


def test_a_batch_that_is_split_frees_its_slot_only_when_every_call_is_over() -> None:
    freed: list[str] = []
    store = Store()
    spec_max = SPEC.max_batch_size
    backend = Watched(freed)

    def free() -> None:
        freed.append(f"after {len(backend.calls)} calls")

    asyncio.run(executor(backend, store, Context(set())).run("m", deliveries(spec_max + 2),
                                                             free))
    assert len(backend.calls) == 2  # too many for one call: split in two
    assert freed[-1] == "after 2 calls" and freed.count("answer built") == spec_max + 2


def test_a_retried_batch_frees_its_slot_when_the_retry_returns() -> None:
    freed: list[str] = []
    backend = Watched(freed, failures=1)

    def free() -> None:
        freed.append(f"after {len(backend.calls)} calls")

    asyncio.run(executor(backend, Store(), Context(set())).run("m", deliveries(2), free))
    assert freed == ["after 2 calls"] + ["answer built"] * 2
    assert backend.free_at_call == [False, False]


class Slow(Backend):
    """Answers only once ``until`` (Unix seconds) has passed."""

    def __init__(self, until: float) -> None:
        super().__init__()
        self.until = until

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes],
                    version: str = "") -> Inferred:
        while time.time() <= self.until:
            await asyncio.sleep(0.01)
        return await super().infer(spec, payloads, version)


def test_an_answer_that_comes_after_its_tasks_deadline_ends_it_expired() -> None:
    """Nothing fitted, the task boards with its deadline ahead; the call returns after it: the
    record is EXPIRED (whoever waited was answered so at the deadline), its batch-mate without
    a deadline SUCCESS, and the call's cost still charged."""
    deadline = time.time() + 1.0
    items = deliveries(2)
    assert items[0].task is not None
    items[0].task.deadline_ms = int(deadline * 1000)
    backend, store = Slow(deadline), Store()
    asyncio.run(executor(backend, store, Context(set())).run("m", items))
    assert len(backend.calls) == 1  # it reached Triton
    records = {c.record.task_id: c for c in store.completed if c.record}
    late = records["t0"]
    assert late.record is not None and late.record.status is Status.EXPIRED
    assert late.record.output is None
    assert (late.record.error or "").startswith("deadline passed during inference")
    assert late.rows == 1 and late.gpu_us > 0 and not late.reusable
    assert late.record.finished_at is not None and late.record.finished_at > deadline
    assert records["t1"].record is not None and records["t1"].record.status is Status.SUCCESS
