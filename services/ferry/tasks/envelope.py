"""A task's envelope: the protobuf ``Task`` that goes on the queue, with its PENDING record and
how it may share work with identical requests. The one place a ``Task`` is made: for a request
(``new_task``), as a rollout's shadow copy (``shadow_of``) and as a cascade's review
(``review_of``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ferry import keys
from ferry.priority import Priority
from ferry.tasks.base import NOT_SHARED, Sharing, input_digest
from ferry.tasks.record import TaskRecord
from ferry.tensors import Tensor
from ferry.v1.task_pb2 import Task


class Envelope(NamedTuple):
    """A task ready for admission."""

    task: Task
    pending: TaskRecord
    sharing: Sharing


class Asked(Protocol):
    """What a request asks for, as a task carries it (``ferry.submission.Submission`` is one)."""

    @property
    def payload(self) -> bytes: ...

    @property
    def content_type(self) -> str: ...

    @property
    def client_id(self) -> str: ...

    @property
    def priority(self) -> Priority: ...

    @property
    def timeout_s(self) -> float | None: ...

    @property
    def no_cache(self) -> bool: ...

    @property
    def callback_url(self) -> str: ...


@dataclass(frozen=True)
class Rules:
    """How the deployment makes tasks: the deadline a request that names none gets, whether
    answers are cached and identical requests collapsed, and how many partitions there are."""

    default_timeout_s: float = 0.0
    cache_ttl_s: float = 0.0
    collapse_requests: bool = False
    partitions: int = 16


@dataclass(frozen=True)
class Tensors:
    """A checked tensor request's part of its task: its inputs, the outputs it asks for, its
    id, and its digest (what its answer may be shared on: ``oip.schedule.TensorTask``)."""

    inputs: Sequence[Tensor]
    outputs: Sequence[str]
    request_id: str
    version: str  # the version it asks for ('': the model's)
    digest: str


def new_task(model: str, version: str, asked: Asked, rules: Rules,
             tensors: Tensors | None = None) -> Envelope:
    """The task a request makes for ``model`` (``version``: whose answers it may share), its
    PENDING record, and how it may share work (its id then puts it in the partition of its
    identical requests)."""
    now = time.time()
    timeout_s = asked.timeout_s or rules.default_timeout_s
    enqueued_ms = int(now * 1000)
    lookup = rules.cache_ttl_s > 0 and not asked.no_cache
    collapse = rules.collapse_requests and not timeout_s  # a deadline is its own
    digest, task_id = "", ""
    if lookup or collapse or rules.cache_ttl_s > 0:
        digest = (tensors.digest if tensors is not None
                  else input_digest(model, version, asked.payload))
        task_id = keys.new_task_id(keys.partition_of_digest(digest, rules.partitions),
                                   rules.partitions)
    task = Task(task_id=task_id or keys.new_task_id(), model=model, payload=asked.payload,
                content_type=asked.content_type, enqueued_at_ms=enqueued_ms,
                client_id=asked.client_id, priority=int(asked.priority),
                deadline_ms=enqueued_ms + math.ceil(timeout_s * 1000) if timeout_s else 0,
                input_digest=digest, digest_version=version if digest else "",
                callback_url=asked.callback_url)
    if tensors is not None:
        _carry(task, tensors)
    sharing = Sharing(digest, lookup, collapse) if digest else NOT_SHARED
    return Envelope(task, TaskRecord.pending(task, now), sharing)


def _carry(task: Task, tensors: Tensors) -> None:
    task.model_version = tensors.version
    task.request_id = tensors.request_id
    task.outputs.extend(tensors.outputs)
    for tensor in tensors.inputs:
        task.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape,
                        contents=tensor.raw)


def shadow_of(task: Task, candidate: str) -> Envelope:
    """A rollout's copy of ``task`` for its ``candidate``: at batch priority, with no deadline,
    owner, webhook or sharing, its answer never returned."""
    shadow = Task()
    shadow.CopyFrom(task)
    shadow.task_id = keys.new_task_id()
    shadow.model_version, shadow.shadow_of = candidate, task.task_id
    shadow.priority = int(Priority.BATCH)
    shadow.callback_url = shadow.input_digest = shadow.digest_version = shadow.client_id = ""
    shadow.deadline_ms = 0
    return Envelope(shadow, TaskRecord.pending(shadow, time.time()), NOT_SHARED)


def review_of(task: Task, model: str, version: str) -> Envelope:
    """A cascade's review of ``task`` by ``model`` (``version``, '': its policy's): the same
    input, at batch priority; its end is written into the reviewed task's record."""
    now = time.time()
    review = Task(task_id=keys.new_task_id(), model=model, model_version=version,
                  payload=task.payload, content_type=task.content_type,
                  enqueued_at_ms=int(now * 1000), client_id=task.client_id,
                  priority=int(Priority.BATCH), review_of=task.task_id,
                  review_webhook=task.callback_url)
    review.inputs.extend(task.inputs)
    review.trace_context.update(task.trace_context)
    return Envelope(review, TaskRecord.pending(review, now), NOT_SHARED)


def timeout_of(task: Task) -> float:
    """The deadline a task was given, in seconds from its acceptance (0: none)."""
    return (task.deadline_ms - task.enqueued_at_ms) / 1000 if task.deadline_ms else 0.0
