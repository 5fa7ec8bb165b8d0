"""The gateway's coordinator: its parts, started and stopped together, and what its routes do
with them. A request is prepared (``gateway.prepare``: checked, its version picked, its
envelope made) and admitted through the one admission port (``tasks.admission``), with shadow
copies (``gateway.shadows``) and idempotency (``tasks.repeats``) as layers; then waited for,
read or cancelled here."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from ferry import keys
from ferry.access import ANONYMOUS, Caller
from ferry.errors import (
    BackendError,
    BadRequestError,
    ConflictError,
    DependencyUnavailableError,
    NotFoundError,
    RedisError,
    RedisUnavailableError,
)
from ferry.gateway.assembly import GatewayRoom
from ferry.gateway.prepare import Prepared
from ferry.oip.hold import Held
from ferry.oip.schedule import TensorTask
from ferry.redis_conn import check_cluster_mode, trouble, warn_of_eviction
from ferry.rollouts.rollout import Sticky
from ferry.rollouts.store import apply_declared
from ferry.submission import Submission
from ferry.tasks import idempotency
from ferry.tasks.admission import Admit, Submitted
from ferry.tasks.base import CancelOutcome, Owner
from ferry.tasks.envelope import Envelope
from ferry.tasks.record import Status, StoredRecord
from ferry.tasks.waiters import Reader, as_due, final_by
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)
CANCEL_WAIT_S = 2.0  # how long a cancel waits for the batcher holding the task to answer


def deadline_of(task: Task) -> float | None:
    """A task's deadline, Unix seconds (None: it has none)."""
    return task.deadline_ms / 1000.0 if task.deadline_ms else None


class Gateway:
    """The operations the routes call (submit, hold, read, cancel, readiness), and the
    gateway's parts started and stopped together. It makes nothing: ``assemble`` made the
    parts it is given, and the routes get theirs from there, not through it."""

    def __init__(self, room: GatewayRoom) -> None:
        parts = self._parts = room.parts
        self._settings = parts.settings
        self._metrics = parts.metrics
        self._store = parts.store
        self._waiters = parts.waiters
        self._access = parts.access
        self._tracing = parts.tracing
        self._catalog = room.catalog
        self._rollouts = room.rollouts
        self._served = room.served
        self._preparer = room.preparer
        self._shadows = room.shadows
        self._admit: Admit = room.shadows  # the one way in, shadows sent
        self._idempotent = room.idempotent

    async def start(self) -> None:
        self._tracing.start()
        with contextlib.suppress(RedisUnavailableError):  # a Redis still starting: checked later
            await check_cluster_mode(self._parts.settings, self._parts.hot)
            await warn_of_eviction(self._parts.hot)
        with contextlib.suppress(RedisUnavailableError):  # the batchers write it too
            await apply_declared(self._rollouts, self._settings.declared_rollouts)
        await self._parts.backend.start()
        with contextlib.suppress(DependencyUnavailableError):  # metrics primed, as at every
            await self._catalog.names()  # read of the models (Triton may answer only later)
        await self._parts.subscriber.start()
        if self._parts.sharded is not None:
            await self._parts.sharded.start()
        await self._served.start()

    async def stop(self) -> None:
        await self._shadows.stop()
        await self._parts.subscriber.stop()  # open long-polls were ended by uvicorn already
        if self._parts.sharded is not None:
            await self._parts.sharded.stop()
        await self._served.stop()
        await self._parts.access.close()
        await self._parts.backend.close()
        await self._parts.hot.close()
        self._tracing.shutdown()

    async def submit(self, submission: Submission, wait_s: float = 0.0,
                     idempotency_key: str | None = None, caller: Caller = ANONYMOUS) -> Submitted:
        """Admit the task; with ``wait_s`` > 0, also its final record if it has one by then.

        With an idempotency key, a repeat of the same request gets the first one's task. An
        authenticated caller's task belongs to it.
        """
        client_id = caller.client_for(submission.client_id)
        if client_id != submission.client_id:
            submission = replace(submission, client_id=client_id)
        with self._access.waiting(caller) if wait_s > 0 else contextlib.nullcontext():
            prepared = await self._preparer.prepare(submission)
            if idempotency_key is None:
                return await self._admitted(prepared.envelope, wait_s, caller.owner)
            return await self._idempotent.once(
                idempotency.redis_key(submission.client_id, idempotency_key),
                prepared.envelope.task.task_id, prepared.digest(), wait_s,
                functools.partial(self._admitted, prepared.envelope, wait_s, caller.owner))

    async def prepare(self, submission: Submission) -> Prepared:
        """The envelope a submission makes, checked against its model (a 4xx if it cannot)."""
        return await self._preparer.prepare(submission)

    async def version_for(self, model: str, asked: str, sticky: Sticky) -> str:
        """The version a request goes to (``Preparer.version_for``)."""
        return await self._preparer.version_for(model, asked, sticky)

    async def _admitted(self, envelope: Envelope, wait_s: float, owner: Owner) -> Submitted:
        """Admit the envelope; with ``wait_s``, watched from before its admission (no end
        missed), and its final record if it has one by then."""
        if wait_s <= 0:
            await self._admit(envelope, owner)
            return Submitted(envelope.task.task_id)
        task_id, due = envelope.task.task_id, deadline_of(envelope.task)
        with self._waiters.watch(task_id) as watch:
            admitted = await self._admit(envelope, owner)
            try:
                record = await final_by(watch, wait_s, due, self._store.expire, admitted.record,
                                        read_first=False)
            except Exception:  # accepted is accepted: the client polls instead of retrying
                log.exception("waiting for task %s failed; answering 202", task_id)
                return Submitted(task_id)
        return Submitted(task_id, record if record is not None and record.status.final
                         else None)

    @contextlib.asynccontextmanager
    async def held(self, tensors: TensorTask, caller: Caller = ANONYMOUS,
                   idempotency_key: str | None = None) -> AsyncIterator[Held]:
        """Admit a tensor task (an infer request of the Open Inference Protocol), watched for
        its end from before its admission, for the duration of the block. Admission is
        ``/v1``'s: backlog limits, deadline, ownership, the result cache and collapsing. With
        an idempotency key, a repeat of the same request (a retry after its gateway died) is
        held on the first one's task instead."""
        checked = tensors.request
        client_id = caller.client_for("")
        submission = Submission(model=checked.model, payload=b"", content_type="",
                                client_id=client_id, priority=tensors.priority,
                                timeout_s=tensors.timeout_s)
        envelope = self._preparer.envelope(checked.model, tensors.version, submission, tensors)
        task_id = envelope.task.task_id
        with self._access.waiting(caller), self._waiters.watch(task_id) as watch:
            due = deadline_of(envelope.task)
            if idempotency_key is None:
                admitted = await self._admit(envelope, caller.owner)
                yield Held(task_id, admitted.record, watch, due, self._store.expire)
                return
            first: list[StoredRecord] = []

            async def admit() -> Submitted:
                first.append((await self._admit(envelope, caller.owner)).record)
                return Submitted(task_id)

            submitted = await self._idempotent.once(
                idempotency.redis_key(client_id, idempotency_key), task_id,
                tensors.request_digest, 0.0, admit)
            if first:
                yield Held(task_id, first[0], watch, due, self._store.expire)
                return
            with self._waiters.watch(submitted.task_id) as replayed:
                record = await self._store.read(submitted.task_id)
                if record is None:
                    raise NotFoundError("unknown_task", f"the task of this Idempotency-Key, "
                                        f"{submitted.task_id}, has expired with its result")
                yield Held(submitted.task_id, record, replayed, record.deadline_at,
                           self._store.expire)

    async def result(self, task_id: str, wait_s: float, caller: Caller = ANONYMOUS
                     ) -> StoredRecord:
        """The task's record, waiting up to ``wait_s`` for a final one; 404 if there is none
        (or it is another client's)."""
        if not 0 <= wait_s <= self._settings.max_poll_s:
            raise BadRequestError("invalid_wait", f"'wait' must be between 0 and "
                                  f"{self._settings.max_poll_s:g} seconds, got {wait_s:g}")
        record = None
        if keys.is_task_id(task_id):
            read = self._reader(caller)
            if wait_s > 0:
                with self._access.waiting(caller), self._waiters.watch(task_id, read) as watch:
                    record = await watch.final(0.0)
                    if record is not None and not record.status.final:
                        record = await final_by(watch, wait_s, record.deadline_at,
                                                self._store.expire, record, read_first=False)
            else:
                record = await as_due(task_id, await read(task_id), self._store.expire)
        if record is None:
            raise self._unknown(task_id)
        return record

    def _reader(self, caller: Caller) -> Reader:
        client_id = caller.client_id
        if client_id is None:
            return self._store.read
        return functools.partial(self._store.read_owned, client_id=client_id)

    async def cancel(self, task_id: str, caller: Caller = ANONYMOUS) -> StoredRecord:
        """End a task CANCELLED if it has not reached Triton; 404 if unknown (or another
        client's), 409 if too late."""
        if not keys.is_task_id(task_id):
            raise self._unknown(task_id)
        with self._waiters.watch(task_id) as watch:  # before asking: no answer missed
            found = await self._store.cancel(task_id, caller.client_id or "")
            if found.outcome is CancelOutcome.UNKNOWN:
                raise self._unknown(task_id)
            if found.outcome is CancelOutcome.SHARED:
                raise ConflictError("shared_inference", f"identical requests share task "
                                    f"{task_id}'s inference; it will run for them")
            record = found.record
            if found.outcome is CancelOutcome.SIGNALLED:  # it settles it unless it has sent it
                record = await watch.final(CANCEL_WAIT_S, read_first=False)
        if record is not None and record.status is Status.CANCELLED:
            self._metrics.cancelled.inc()
            return record
        if record is not None and record.status.final:
            raise ConflictError("already_finished", f"task {task_id} has already ended "
                                f"{record.status.value}; nothing to cancel")
        raise ConflictError("already_running", f"task {task_id} has reached Triton and will "
                            "finish; it cannot be cancelled any more")

    def _unknown(self, task_id: str) -> NotFoundError:
        return NotFoundError("unknown_task", f"no task {task_id!r}: it never existed, or its "
                             f"result expired ({self._settings.result_ttl_s} s after it finished)")

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        checks: dict[str, str] = {}
        try:
            await self._parts.hot.execute("PING")
            checks["redis"] = await trouble(self._parts.hot,
                                            self._settings.redis_min_replicas) or "ok"
        except RedisError as exc:  # a refused INFO (permanent) too: not ready, and why
            checks["redis"] = f"unreachable: {exc}"
        checks["triton"] = "ok" if await self._parts.backend.server_ready() else "not ready"
        try:
            models = await self._parts.backend.ready_models()
            ok = self._settings.default_model in models
            checks["default_model"] = "ok" if ok else f"{self._settings.default_model!r} not ready"
        except BackendError as exc:
            checks["default_model"] = f"unknown: {exc}"
        return all(v == "ok" for v in checks.values()), checks

    async def serving(self) -> bool:
        """Whether a request could be served now: Redis answers and Triton is ready (the
        Open Inference Protocol's server readiness)."""
        try:
            await self._parts.hot.execute("PING")
        except RedisError:
            return False
        return await self._parts.backend.server_ready()
