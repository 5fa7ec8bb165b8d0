"""Tensor tasks in the batcher, without servers: lanes by signature, batches cut by rows, the
inputs joined and the outputs cut back per task."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from ferry.batcher.executor import Standalone
from ferry.batcher.reader import lane_of
from ferry.batcher.tensor_batch import answers, joined_inputs, rows_of, signature
from ferry.errors import PermanentBackendError
from ferry.oip.answer import answer_tensors
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.rules.policy import Lane
from ferry.rules.rows import row_chunks
from ferry.tasks.record import Status
from ferry.tensors import Tensor
from ferry.v1.task_pb2 import Task
from ferry.v1.task_pb2 import Tensor as WireTensor
from tests.unit.test_executor import Backend, Store, executor


def tensor_task(task_id: str, rows: int, *, width: int = 2, outputs: tuple[str, ...] = (),
                version: str = "", request_id: str = "") -> Task:
    data = np.arange(rows * width, dtype="<f4") + 100 * int(task_id.lstrip("t") or 0)
    wire = WireTensor(name="X", datatype="FP32", shape=[rows, width], contents=data.tobytes())
    return Task(task_id=task_id, model="m", model_version=version, inputs=[wire],
                outputs=list(outputs), request_id=request_id)


def delivery(task: Task, deliveries: int = 1) -> Delivery:
    return Delivery(0, "s", f"{task.task_id}-0", b"", task, deliveries=deliveries)


@pytest.mark.parametrize(("rows", "limit", "chunks"), [
    ([], 8, []),
    ([1, 2, 3], 8, [[0, 1, 2]]),
    ([3, 3, 3], 8, [[0, 1], [2]]),
    ([8, 1, 8], 8, [[0], [1], [2]]),
    ([9, 1, 1], 8, [[0], [1, 2]]),  # over the limit: alone, so Triton refuses it, not its mates
    ([1, 1, 1], 0, [[0], [1], [2]]),  # a model that does not batch: one request per call
    ([2, 2, 2, 2], 4, [[0, 1], [2, 3]]),
])
def test_row_chunks_are_greedy_in_order(rows: list[int], limit: int,
                                        chunks: list[list[int]]) -> None:
    assert [list(c) for c in row_chunks(rows, limit)] == chunks


def test_a_bytes_tasks_lane_is_unchanged() -> None:
    task = Task(task_id="t", model="m", payload=b"x", priority=1)
    assert lane_of(delivery(task)) == Lane("m", Priority.of(1))
    assert lane_of(delivery(task, deliveries=2)) == Lane("m", Priority.of(1), suspect=True)


def test_tensor_tasks_share_a_lane_only_with_their_signature() -> None:
    base = lane_of(delivery(tensor_task("t1", 1)))
    assert base.signature == ("", (("X", "FP32", (2,)),), ())
    assert lane_of(delivery(tensor_task("t2", 3))) == base  # rows differ: same lane
    for other in (tensor_task("t3", 1, width=3), tensor_task("t4", 1, outputs=("OUT_X",)),
                  tensor_task("t5", 1, version="2")):
        assert lane_of(delivery(other)) != base
    assert signature(tensor_task("t6", 2)) == base.signature


def test_inputs_join_and_outputs_split_back_per_task() -> None:
    tasks = [tensor_task("t1", 1, request_id="a"), tensor_task("t2", 3)]
    assert [rows_of(t, True) for t in tasks] == [1, 3] and rows_of(tasks[1], False) == 1
    (joined,) = joined_inputs(tasks, batched=True)
    assert joined.shape == (4, 2)
    out = Tensor("Y", joined.datatype, joined.shape, joined.raw)
    first, second = answers([out], tasks, batched=True)
    assert first["id"] == "a" and "id" not in second
    assert [t.shape for t in answer_tensors(second)] == [(3, 2)]
    assert answer_tensors(second)[0].raw == tasks[1].inputs[0].contents


def test_tasks_that_cannot_be_joined_are_a_permanent_failure() -> None:
    other = tensor_task("t2", 1)
    other.inputs[0].name = "Z"
    with pytest.raises(PermanentBackendError):
        joined_inputs([tensor_task("t1", 1), other], batched=True)


def test_the_executor_keeps_each_call_within_the_models_rows() -> None:
    backend, store = Backend(), Store()  # the stand-in model batches 8 rows
    tasks = [tensor_task(f"t{i}", 3) for i in range(3)]
    asyncio.run(executor(backend, store, Standalone()).run("m", [delivery(t) for t in tasks]))
    assert sorted(backend.tensor_calls) == [[(3, 2)], [(6, 2)]]
    for completion, task in zip(store.completed, tasks, strict=True):
        assert completion.record is not None and completion.record.status is Status.SUCCESS
        (out,) = answer_tensors(completion.record.output)
        assert (out.name, out.raw) == ("OUT_X", task.inputs[0].contents)


class Unbatched(Backend):
    """A model that does not batch (max_batch_size 0)."""

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        return {"name": model, "max_batch_size": 0}


def test_a_model_that_does_not_batch_takes_each_request_as_it_is() -> None:
    backend, store = Unbatched(), Store()
    tasks = [tensor_task(f"t{i}", 2, request_id=f"r{i}") for i in range(3)]
    asyncio.run(executor(backend, store, Standalone()).run("m", [delivery(t) for t in tasks]))
    assert backend.tensor_calls == [[(2, 2)]] * 3  # one call each, no batch dimension added
    for completion, task in zip(store.completed, tasks, strict=True):
        assert completion.record is not None and completion.record.status is Status.SUCCESS
        assert completion.record.output["id"] == task.request_id
