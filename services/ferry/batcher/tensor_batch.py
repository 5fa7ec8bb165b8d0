"""Tensor tasks in one batch: the lane they share, their rows, their inputs joined along the
batch dimension, and every output cut back into each task's answer. Pure code, no I/O.

A tensor task (one with ``inputs``) travels only with tasks of the same signature: the model
version, each input's name, datatype and non-batch shape, and the outputs asked for. A model
that batches takes the tasks' rows in one call; one that does not (``max_batch_size`` 0) takes
one task per call, its tensors as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ferry.errors import PermanentBackendError
from ferry.oip.answer import answer_json
from ferry.tensors import Tensor, TensorError, concat, split
from ferry.v1.task_pb2 import Task


def signature(task: Task) -> tuple[object, ...]:
    """What the task's batch-mates must share; cheap (no tensor is read)."""
    return (task.model_version,
            tuple([(t.name, t.datatype, tuple(t.shape[1:])) for t in task.inputs]),
            tuple(task.outputs))


def task_tensors(task: Task) -> list[Tensor]:
    """The task's input tensors, as the envelope carries them."""
    return [Tensor(t.name, t.datatype, tuple(t.shape), t.contents) for t in task.inputs]


def rows_of(task: Task, batched: bool) -> int:
    """The task's rows: its inputs' first dimension for a model that batches, else 1."""
    if not batched or not task.inputs or not task.inputs[0].shape:
        return 1
    return int(task.inputs[0].shape[0])


def joined_inputs(tasks: Sequence[Task], batched: bool) -> list[Tensor]:
    """Each input of the first task joined with the same-named input of every other, in batch
    order; a model that does not batch takes its one task's tensors as they are."""
    first = task_tensors(tasks[0])
    if not batched:
        return first
    others = [{t.name: t for t in task_tensors(task)} for task in tasks[1:]]
    try:
        return [concat([tensor, *(named[tensor.name] for named in others)])
                for tensor in first]
    except (KeyError, TensorError) as exc:
        raise PermanentBackendError(f"tensor batch cannot be joined: {exc}") from exc


def answers(outputs: Sequence[Tensor], tasks: Sequence[Task],
            batched: bool) -> list[dict[str, Any]]:
    """Each task's share of the outputs, as its record's answer, in batch order."""
    if not batched:
        return [answer_json(outputs, tasks[0].request_id)]
    try:
        parts = [split(tensor, [rows_of(task, True) for task in tasks]) for tensor in outputs]
    except TensorError as exc:
        raise PermanentBackendError(f"outputs cannot be split by rows: {exc}") from exc
    return [answer_json([part[i] for part in parts], task.request_id)
            for i, task in enumerate(tasks)]
