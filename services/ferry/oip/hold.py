"""An infer call held open until its task ends, for REST and gRPC alike.

The gateway admits the checked request as a task and watches it; the call waits for the task's
final record (within the request's timeout) and answers from it: the outputs on SUCCESS, or the
error Triton would give. An EXPIRED task, or one still queued when its timeout passed, answers as
Triton answers a request whose timeout expired (``UNAVAILABLE``, 503 over HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ferry.access import Caller
from ferry.errors import ClientError, DependencyUnavailableError
from ferry.oip.answer import answer_tensors
from ferry.oip.schedule import TensorTask
from ferry.rollouts.rollout import Sticky
from ferry.tasks.record import Status, StoredRecord
from ferry.tasks.waiters import Expire, Watch, final_by
from ferry.tensors import Tensor, TensorError

HOLD_S = 86_400.0  # how long a call without a timeout is held open at most
TIMED_OUT = "Request timeout expired"  # Triton's words, with its code UNAVAILABLE


async def _unexpired(task_id: str) -> StoredRecord | None:
    """No expiry: the record stays as it stands."""
    return None


@dataclass(frozen=True)
class Held:
    """An admitted tensor task, watched for its end: its id and the record it started with
    (final already when the result cache answered it), its deadline (Unix seconds; None: it has
    none) and the store's step that ends it EXPIRED once the deadline has passed."""

    task_id: str
    record: StoredRecord
    watch: Watch
    due: float | None = None
    expire: Expire = _unexpired

    async def final(self, timeout_s: float) -> StoredRecord:
        """The record once final, or as it stands when ``timeout_s`` has passed; at the task's
        deadline, EXPIRED if it has not ended (``tasks.waiters.final_by``)."""
        record = await final_by(self.watch, timeout_s, self.due, self.expire, self.record,
                                read_first=False)
        return record or self.record


ROLLOUT_KEY_HEADER = "x-rollout-key"  # what a rollout's sticky split keys on (else the client)
# A unary call's key (an HTTP header, gRPC metadata): its retry, with the same key and request,
# is held on the task the first call admitted (a retry after its gateway died runs nothing again).
IDEMPOTENCY_KEY_HEADER = "idempotency-key"


class TensorGateway(Protocol):
    """What an infer call needs of the gateway."""

    def held(self, tensors: TensorTask, caller: Caller, idempotency_key: str | None = None
             ) -> AbstractAsyncContextManager[Held]:
        """Admit the task (with an idempotency key, once: a repeat gets the first one's);
        watch it for the duration of the block."""
        ...

    async def cancel(self, task_id: str, caller: Caller) -> StoredRecord:
        """End the task CANCELLED if it has not reached Triton (a ``ClientError`` if not)."""
        ...

    async def version_for(self, model: str, asked: str, sticky: Sticky) -> str:
        """The version a request that names none goes to: its model's rollout's pick, split
        by its client and rollout key ('' : Triton's version policy)."""
        ...


class Failure(Enum):
    """Why a held call gets no outputs, named as gRPC names its status (HTTP's in ``http``)."""

    UNAVAILABLE = 503  # the timeout passed, or the task EXPIRED
    INTERNAL = 500  # the task FAILED, or its record holds no tensors
    CANCELLED = 400  # cancelled by its client (through /v1) before it ran

    @property
    def http(self) -> int:
        return self.value


@dataclass(frozen=True)
class Answered:
    """A task's outputs and the model version that gave them."""

    outputs: list[Tensor]
    version: str


@dataclass(frozen=True)
class Refused:
    """A held call's error: its kind and Triton-style message."""

    failure: Failure
    message: str


_FAILURES = {Status.EXPIRED: Failure.UNAVAILABLE, Status.PENDING: Failure.UNAVAILABLE,
             Status.FAILED: Failure.INTERNAL, Status.CANCELLED: Failure.CANCELLED}


def outcome(record: StoredRecord, task: TensorTask) -> Answered | Refused:
    """What a call answers for its task's record (final, or as it stood at the timeout)."""
    if record.status is not Status.SUCCESS:
        return Refused(_FAILURES[record.status], _reason(record))
    document = record.to_json()
    try:
        outputs = answer_tensors(document.get("output") or {})
    except TensorError as exc:
        return Refused(Failure.INTERNAL, f"the task's answer holds no tensors: {exc}")
    return Answered(outputs, str(document.get("model_version") or task.request.version))


def _reason(record: StoredRecord) -> str:
    if record.status in (Status.EXPIRED, Status.PENDING):
        return TIMED_OUT
    error = record.to_json().get("error")
    return str(error) if error else f"the task ended {record.status.value}"


async def cancel_quietly(gateway: TensorGateway, task_id: str, caller: Caller) -> None:
    """Cancel a task nobody waits for any more; too late (it runs) is no error, and the
    cancel itself is shielded from the cancellation of the call that asks for it."""
    with contextlib.suppress(ClientError, DependencyUnavailableError):
        await asyncio.shield(gateway.cancel(task_id, caller))
