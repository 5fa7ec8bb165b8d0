"""What the gateway does for a request, apart from HTTP: admit a task, find or wait for a result."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from ferry import keys
from ferry.access import ANONYMOUS, Caller
from ferry.compose.gateway import GatewayParts
from ferry.errors import (
    BackendError,
    BadRequestError,
    ClientError,
    ConflictError,
    DependencyUnavailableError,
    NotFoundError,
    ServiceUnavailableError,
    TooManyRequestsError,
    UnprocessableError,
)
from ferry.gateway.catalog import ModelCatalog
from ferry.gateway.intake import Submission, TensorSubmission, check_payload
from ferry.gateway.versions import Versions
from ferry.oip.hold import Held
from ferry.oip.schedule import TensorTask
from ferry.oip.served import ServedDesk
from ferry.priority import Priority
from ferry.redis_conn import REDIS_UNAVAILABLE, check_cluster_mode, trouble, warn_of_eviction
from ferry.rollouts.rollout import Sticky, parse_declared
from ferry.rollouts.store import Pair, RolloutStore, apply_declared
from ferry.tasks import idempotency
from ferry.tasks.base import (
    NO_OWNER,
    NOT_SHARED,
    Admission,
    Admitted,
    CancelOutcome,
    Owner,
    Sharing,
    input_digest,
)
from ferry.tasks.capacity import Capacity
from ferry.tasks.idempotency import IdempotencyKeys
from ferry.tasks.record import Status, StoredRecord, TaskRecord
from ferry.tasks.waiters import Reader
from ferry.tensors import TensorError
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)
UNMEASURED_BACKLOG_LIMIT = 1000  # per model, until a batcher has measured its throughput
ADMISSIONS_KEPT = 1024  # kinds of task (model, priority, timeout) whose limits are kept
CANCEL_WAIT_S = 2.0  # how long a cancel waits for the batcher holding the task to answer
IDEMPOTENT_WAIT_TRIES, IDEMPOTENT_WAIT_S = 20, 0.05  # a repeat waits for the first's admission
IDEMPOTENT_TAKEOVER_TRIES = 3  # a repeat takes over a key whose task never came to be
RELEASE_KEY_ON: tuple[type[Exception], ...] = (ClientError, *REDIS_UNAVAILABLE)  # not admitted
TENSOR_FORM = "tensors"  # an idempotency digest's content type for /v1's tensor form


class Prepared(NamedTuple):
    """A checked submission as its task: see ``Gateway.prepare``."""

    task: Task
    pending: TaskRecord
    sharing: Sharing
    digest: Callable[[], str]


@dataclass(frozen=True)
class Submitted:
    """An admitted (or replayed) task: its id, its final record when the client waited for it
    and it has one, and whether it is a repeat's answer."""

    task_id: str
    record: StoredRecord | None = None
    replayed: bool = False


def _carry(task: Task, tensors: TensorTask) -> None:
    """Put a tensor task's inputs, requested outputs, request id and version in its envelope."""
    checked = tensors.request
    task.model_version = checked.version
    task.request_id = tensors.request_id
    task.outputs.extend(checked.outputs)
    for tensor in checked.inputs:
        task.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape,
                        contents=tensor.raw)


class Gateway:
    """The gateway's parts, started and stopped together, and the operations its routes call."""

    def __init__(self, parts: GatewayParts) -> None:
        self.parts = parts
        self.settings = parts.settings
        self.metrics = parts.metrics
        self.store = parts.store
        self.waiters = parts.waiters
        self.capacity = parts.capacity
        self.idempotency = IdempotencyKeys(parts.hot)
        self.access = parts.access
        self.tracing = parts.tracing
        self._admissions: dict[tuple[str, str, Priority, float],
                               tuple[Capacity, Admission]] = {}
        self.catalog = ModelCatalog(parts.backend, parts.settings.catalog_refresh_s,
                                    on_names=self.metrics.prime)
        self.rollouts = RolloutStore(parts.hot)
        self.versions = Versions(self.rollouts)
        self._shadows: set[asyncio.Task[None]] = set()
        self.served = ServedDesk(parts.hot)  # the protocol's statistics: answers shared

    async def start(self) -> None:
        self.tracing.start()
        with contextlib.suppress(*REDIS_UNAVAILABLE):  # a Redis still starting: checked later
            await check_cluster_mode(self.parts.settings, self.parts.redis)
            await warn_of_eviction(self.parts.redis)
        with contextlib.suppress(*REDIS_UNAVAILABLE):  # the batchers write it too
            await apply_declared(self.rollouts, parse_declared(self.settings.rollouts))
        await self.parts.backend.start()
        with contextlib.suppress(DependencyUnavailableError):  # metrics primed, as at every
            await self.catalog.names()  # read of the models (Triton may answer only later)
        await self.parts.subscriber.start()
        await self.served.start()

    async def stop(self) -> None:
        if self._shadows:  # copies being admitted: a moment to finish, then they are dropped
            await asyncio.wait(self._shadows, timeout=1.0)
            for shadow in self._shadows:
                shadow.cancel()
        await self.parts.subscriber.stop()  # open long-polls were ended by uvicorn already
        await self.served.stop()
        await self.parts.access.close()
        await self.parts.backend.close()
        await self.parts.hot.close()
        await self.parts.redis.aclose()
        self.tracing.shutdown()

    async def submit(self, submission: Submission, wait_s: float = 0.0,
                     idempotency_key: str | None = None, caller: Caller = ANONYMOUS) -> Submitted:
        """Admit the task; with ``wait_s`` > 0, also its final record if it has one by then.

        With an idempotency key, a repeat of the same request gets the first one's task. An
        authenticated caller's task belongs to it.
        """
        client_id = caller.client_for(submission.client_id)
        if client_id != submission.client_id:
            submission = replace(submission, client_id=client_id)
        if wait_s > 0:
            with self.access.waiting(caller):
                return await self._submit(submission, wait_s, idempotency_key, caller.owner)
        return await self._submit(submission, wait_s, idempotency_key, caller.owner)

    async def _submit(self, submission: Submission, wait_s: float, idempotency_key: str | None,
                      owner: Owner) -> Submitted:
        task, pending, sharing, digest = await self.prepare(submission)
        if idempotency_key is None:
            return await self._admit(task, pending, sharing, submission, wait_s, owner=owner)
        return await self._admit_once(task, pending, sharing, submission, wait_s,
                                      idempotency_key=idempotency_key, digest=digest(),
                                      owner=owner)

    async def prepare(self, submission: Submission) -> Prepared:
        """The task a submission makes, checked against its model (a 4xx saying what is wrong,
        nothing admitted): the task, its PENDING record, how it may share work, and its
        idempotency digest (made when asked for)."""
        if isinstance(submission, TensorSubmission):
            return await self._prepare_tensors(submission)
        spec = await self.catalog.resolve(submission.model or self.settings.default_model)
        version = submission.version
        if version or spec.default_version or self.versions.may_pick(spec.name):
            version = await self.version_for(spec.name, version, Sticky(
                submission.client_id, submission.rollout_key))
        if spec.input_kind == "image":
            await asyncio.to_thread(check_payload, spec.input_kind, submission.payload)
        else:
            check_payload(spec.input_kind, submission.payload)
        task, pending, sharing = self._new_task(spec.name, version or spec.version, submission)
        task.model_version = version
        return Prepared(task, pending, sharing, lambda: idempotency.request_digest(
            spec.name, task.priority, task.content_type, task.payload, submission.version))

    async def version_for(self, model: str, asked: str, sticky: Sticky) -> str:
        """The version a request of ``model`` goes to: the one it pins (a 404 if Triton has no
        such version ready), else its rollout's pick, else the model's default version, else
        '' (Triton's version policy). A candidate whose circuit breaker is open gives its
        share to the stable version."""
        pick, rollout = await self.versions.pick(model, asked, sticky)
        if pick.role == "policy":
            return await self.catalog.default_version(model)
        if pick.role == "candidate" and rollout is not None:
            state, _ = (await self.capacity.of(model)).breaker_of(pick.version)
            if state == "open":
                return rollout.stable
        if pick.role == "pinned":
            try:
                await self.catalog.metadata(model, asked)
            except BackendError as exc:
                if exc.transient:
                    raise
                raise NotFoundError("unknown_model_version", exc.reason) from None  # Triton's
        return pick.version

    async def _prepare_tensors(self, submission: TensorSubmission) -> Prepared:
        """``/v1``'s tensor form: checked against the model's tensors as ``/v2``'s infer checks
        them (a 400 saying what differs, nothing enqueued), then admitted as any task is."""
        form = submission.tensors
        model = submission.model or self.settings.default_model
        asked = submission.version or form.version
        version = (asked or await self.version_for(
            model, "", Sticky(submission.client_id, submission.rollout_key)))
        interface = await self.catalog.tensor_interface(model, version)
        request = form.request
        try:
            checked = interface.check(request.inputs, request.output_names, version)
        except TensorError as exc:
            raise BadRequestError("invalid_tensors", str(exc)) from None
        tensors = TensorTask(checked, request.id, submission.priority, submission.timeout_s,
                             newest=interface.newest, own_id=True)
        task, pending, sharing = self._new_task(checked.model, tensors.version, submission,
                                                tensors)
        return Prepared(task, pending, sharing, lambda: idempotency.request_digest(
            checked.model, task.priority, TENSOR_FORM, tensors.request_digest.encode(), asked))

    async def admit_prepared(self, task: Task, pending: TaskRecord, sharing: Sharing,
                             submission: Submission, owner: Owner) -> Admitted:
        """Admit a prepared task (a bulk job's item) as any task is admitted."""
        admission = await self.admission(task.model, submission.priority,
                                         submission.timeout_s or self.settings.default_timeout_s,
                                         task.model_version)
        admitted = await self.store.admit(task, pending, admission, sharing, owner)
        self._count(task, admitted, pending.created_at)
        return admitted

    async def _admit_once(self, task: Task, pending: TaskRecord, sharing: Sharing,
                          submission: Submission, wait_s: float, *, idempotency_key: str,
                          digest: str, owner: Owner) -> Submitted:
        """Admit the task unless its idempotency key names another's: then that task."""
        key = idempotency.redis_key(submission.client_id, idempotency_key)
        replay = await self._take_key(key, task.task_id, digest, wait_s)
        if replay is not None:
            return replay
        try:
            submitted = await self._admit(task, pending, sharing, submission, wait_s,
                                          owner=owner)
        except RELEASE_KEY_ON:
            with contextlib.suppress(Exception):  # best effort: a retry will find it stale
                await self.idempotency.release(key, task.task_id, digest)
            raise
        with contextlib.suppress(*REDIS_UNAVAILABLE):  # unconfirmed: still replayed
            await self.idempotency.confirm(key, task.task_id, digest)  # while its record lives
        return submitted

    @contextlib.asynccontextmanager
    async def held(self, tensors: TensorTask, caller: Caller = ANONYMOUS
                   ) -> AsyncIterator[Held]:
        """Admit a tensor task (an infer request of the Open Inference Protocol), watched for
        its end from before its admission, for the duration of the block. Admission is
        ``/v1``'s: backlog limits, deadline, ownership, the result cache and collapsing."""
        checked = tensors.request
        submission = Submission(model=checked.model, payload=b"", content_type="",
                                client_id=caller.client_for(""), priority=tensors.priority,
                                timeout_s=tensors.timeout_s)
        task, pending, sharing = self._new_task(checked.model, tensors.version, submission,
                                                tensors)
        admission = await self.admission(task.model, submission.priority,
                                         submission.timeout_s or self.settings.default_timeout_s,
                                         task.model_version)
        with self.access.waiting(caller), self.waiters.watch(task.task_id) as watch:
            admitted = await self.store.admit(task, pending, admission, sharing, caller.owner)
            self._count(task, admitted, pending.created_at)
            yield Held(task.task_id, admitted.record, watch)

    def _new_task(self, model: str, version: str, submission: Submission,
                  tensors: TensorTask | None = None) -> tuple[Task, TaskRecord, Sharing]:
        """The task, its PENDING record, and how it may share work with identical requests (its
        id then puts it in their partition)."""
        now = time.time()
        timeout_s = submission.timeout_s or self.settings.default_timeout_s
        enqueued_ms = int(now * 1000)
        lookup = self.settings.cache_ttl_s > 0 and not submission.no_cache
        collapse = self.settings.collapse_requests and not timeout_s  # a deadline is its own
        digest, task_id = "", ""
        if lookup or collapse or self.settings.cache_ttl_s > 0:
            digest = (tensors.digest if tensors is not None
                      else input_digest(model, version, submission.payload))
            partitions = self.settings.partitions
            task_id = keys.new_task_id(keys.partition_of_digest(digest, partitions), partitions)
        task = Task(task_id=task_id or keys.new_task_id(), model=model,
                    payload=submission.payload, content_type=submission.content_type,
                    enqueued_at_ms=enqueued_ms, client_id=submission.client_id,
                    priority=int(submission.priority),
                    deadline_ms=enqueued_ms + math.ceil(timeout_s * 1000) if timeout_s else 0,
                    input_digest=digest, digest_version=version if digest else "",
                    callback_url=submission.callback_url)
        if tensors is not None:
            _carry(task, tensors)
        if self.tracing.enabled:
            self.tracing.inject(task.trace_context)
        pending = TaskRecord.pending(task, now)
        if not digest:
            return task, pending, NOT_SHARED
        return task, pending, Sharing(digest, lookup, collapse)

    async def _admit(self, task: Task, pending: TaskRecord, sharing: Sharing,
                     submission: Submission, wait_s: float, *, owner: Owner) -> Submitted:
        admission = await self.admission(task.model, submission.priority,
                                         submission.timeout_s or self.settings.default_timeout_s,
                                         task.model_version)
        if wait_s <= 0:
            self._count(task, await self.store.admit(task, pending, admission, sharing,
                                                           owner), pending.created_at)
            return Submitted(task.task_id)
        with self.waiters.watch(task.task_id) as watch:  # before admission: no completion missed
            admitted = await self.store.admit(task, pending, admission, sharing, owner)
            self._count(task, admitted, pending.created_at)
            try:
                record = await watch.final(wait_s, admitted.record, read_first=False)
            except Exception:  # accepted is accepted: the client polls instead of retrying
                log.exception("waiting for task %s failed; answering 202", task.task_id)
                return Submitted(task.task_id)
        return Submitted(task.task_id, record if record is not None and record.status.final
                         else None)

    def _count(self, task: Task, admitted: Admitted, accepted_at: float) -> None:
        model = task.model
        self.metrics.accepted_child(model, task.model_version).inc()
        if admitted.how != "queued":
            self.metrics.shared.labels(model, admitted.how, task.model_version).inc()
            self.served.tally.shared(model, task.model_version, time.time() - accepted_at)
        rollout = self.versions.cached(model)
        if (rollout is not None and rollout.shadowed_version(task.model_version, random.random())
                and not task.shadow_of and not task.review_of):
            shadow = asyncio.create_task(self._shadow(task, rollout.candidate),
                                         name=f"ferry-shadow-{task.task_id}")
            self._shadows.add(shadow)
            shadow.add_done_callback(self._shadows.discard)

    async def _shadow(self, task: Task, candidate: str) -> None:
        """Admit a copy of ``task`` for the candidate, at batch priority, never waited for; it
        is dropped (counted) rather than queued when the model's backlog is high."""
        shadow = Task()
        shadow.CopyFrom(task)
        shadow.task_id = keys.new_task_id()
        shadow.model_version, shadow.shadow_of = candidate, task.task_id
        shadow.priority = int(Priority.BATCH)
        shadow.callback_url = shadow.input_digest = shadow.digest_version = shadow.client_id = ""
        shadow.deadline_ms = 0
        now = time.time()
        try:
            admission = await self.admission(task.model, Priority.BATCH, 0.0, candidate)
            await self.store.admit(shadow, TaskRecord.pending(shadow, now), admission,
                                   NOT_SHARED, NO_OWNER)
            await self.rollouts.add_pair(task.model, Pair(task.task_id, shadow.task_id,
                                                          candidate), now)
        except (TooManyRequestsError, ServiceUnavailableError):
            self.metrics.shadows.labels(task.model, "dropped").inc()
            return
        except REDIS_UNAVAILABLE as exc:
            log.warning("shadow of task %s not admitted: %s", task.task_id, exc)
            self.metrics.shadows.labels(task.model, "dropped").inc()
            return
        self.metrics.shadows.labels(task.model, "sent").inc()

    async def _take_key(self, key: str, task_id: str, digest: str,
                        wait_s: float) -> Submitted | None:
        """Take the idempotency key for ``task_id`` (None: this request admits its task), or
        the answer of the first request that took it."""
        holder = await self.idempotency.claim(key, task_id, digest)
        for _ in range(IDEMPOTENT_TAKEOVER_TRIES):
            if holder is None:
                return None
            replay = await self._replay(key, holder, digest, wait_s)
            if replay is not None:
                return replay
            if await self.idempotency.replace(key, holder, task_id, digest):
                return None  # the first request's task never came to be: this one takes over
            holder = await self.idempotency.claim(key, task_id, digest)  # another one did
        raise ServiceUnavailableError("idempotency_contended", "concurrent repeats of this "
                                      "request keep replacing each other; retry", 1.0)

    async def _replay(self, key: str, holder: idempotency.Claimed, digest: str,
                      wait_s: float) -> Submitted | None:
        """The first request's task for a repeat; None if that task never came to be (its
        request failed before admission) and this request takes the key over."""
        if holder.digest != digest:
            raise UnprocessableError("idempotency_key_reused", "this Idempotency-Key was used "
                                     f"with a different request (task {holder.task_id}); a "
                                     "key stands for one request for 24 h")
        record = await self.store.read(holder.task_id)
        for _ in range(0 if holder.admitted else IDEMPOTENT_WAIT_TRIES):  # it may be admitting
            if record is not None:
                break
            await asyncio.sleep(IDEMPOTENT_WAIT_S)
            record = await self.store.read(holder.task_id)
        if record is None and holder.admitted:  # admitted, and its result has expired since
            self.metrics.replayed.inc()
            return Submitted(holder.task_id, None, replayed=True)
        if record is None:
            return None
        if not holder.admitted:  # its first request may have failed before its WAIT did
            await self.store.reconfirm(holder.task_id)
        if wait_s > 0 and not record.status.final:
            with self.waiters.watch(holder.task_id) as watch:
                record = await watch.final(wait_s) or record
        self.metrics.replayed.inc()
        return Submitted(holder.task_id, record if record.status.final and wait_s > 0 else None,
                         replayed=True)

    async def admission(self, model: str, priority: Priority, timeout_s: float,
                        version: str = "") -> Admission:
        """The limits for a new task of the model's ``version`` ('': Triton's policy picks):
        its priority's share of the model's backlog limit (set, or sized from the measured
        rate), and the measured rate to predict its wait; a 503 while that version's circuit
        breaker is open and no fallback answers. The same limits are shared by every task of a
        kind until the capacity view changes."""
        capacity = await self.capacity.of(model)
        key = (model, version, priority, timeout_s)
        cached = self._admissions.get(key)
        if cached is not None and cached[0] is capacity:
            return cached[1]
        breaker, retry_after_s = capacity.breaker_of(version)
        if breaker == "open" and not capacity.fallback:
            named = f"model {model!r}" + (f" version {version}" if version else "")
            raise ServiceUnavailableError(
                "circuit_open", f"{named} is failing (its circuit breaker is open) and has no "
                "fallback model; try again later", retry_after_s)
        limit = self.settings.max_backlog
        if not limit:
            limit = (math.ceil(capacity.rate * self.settings.max_queue_wait_s) if capacity.rate
                     else UNMEASURED_BACKLOG_LIMIT)
        admission = Admission(limit=max(1, math.floor(limit * priority.backlog_share)),
                              rate=capacity.rate, batch_s=capacity.batch_s, timeout_s=timeout_s,
                              partitions=self.settings.partitions)
        if len(self._admissions) > ADMISSIONS_KEPT:
            self._admissions.clear()
        self._admissions[key] = (capacity, admission)
        return admission

    async def result(self, task_id: str, wait_s: float, caller: Caller = ANONYMOUS
                     ) -> StoredRecord:
        """The task's record, waiting up to ``wait_s`` for a final one; 404 if there is none
        (or it is another client's)."""
        if not 0 <= wait_s <= self.settings.max_poll_s:
            raise BadRequestError("invalid_wait", f"'wait' must be between 0 and "
                                  f"{self.settings.max_poll_s:g} seconds, got {wait_s:g}")
        record = None
        if keys.is_task_id(task_id):
            read = self._reader(caller)
            if wait_s > 0:
                with self.access.waiting(caller), self.waiters.watch(task_id, read) as watch:
                    record = await watch.final(wait_s)
            else:
                record = await read(task_id)
        if record is None:
            raise self._unknown(task_id)
        return record

    def _reader(self, caller: Caller) -> Reader:
        client_id = caller.client_id
        if client_id is None:
            return self.store.read
        return functools.partial(self.store.read_owned, client_id=client_id)

    async def cancel(self, task_id: str, caller: Caller = ANONYMOUS) -> StoredRecord:
        """End a task CANCELLED if it has not reached Triton; 404 if unknown (or another
        client's), 409 if too late."""
        if not keys.is_task_id(task_id):
            raise self._unknown(task_id)
        with self.waiters.watch(task_id) as watch:  # before asking: no answer missed
            found = await self.store.cancel(task_id, caller.client_id or "")
            if found.outcome is CancelOutcome.UNKNOWN:
                raise self._unknown(task_id)
            if found.outcome is CancelOutcome.SHARED:
                raise ConflictError("shared_inference", f"identical requests share task "
                                    f"{task_id}'s inference; it will run for them")
            record = found.record
            if found.outcome is CancelOutcome.SIGNALLED:  # it settles it unless it has sent it
                record = await watch.final(CANCEL_WAIT_S, read_first=False)
        if record is not None and record.status is Status.CANCELLED:
            self.metrics.cancelled.inc()
            return record
        if record is not None and record.status.final:
            raise ConflictError("already_finished", f"task {task_id} has already ended "
                                f"{record.status.value}; nothing to cancel")
        raise ConflictError("already_running", f"task {task_id} has reached Triton and will "
                            "finish; it cannot be cancelled any more")

    def _unknown(self, task_id: str) -> NotFoundError:
        return NotFoundError("unknown_task", f"no task {task_id!r}: it never existed, or its "
                             f"result expired ({self.settings.result_ttl_s} s after it finished)")

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        checks: dict[str, str] = {}
        try:
            await self.parts.redis.ping()
            checks["redis"] = await trouble(self.parts.redis,
                                            self.settings.redis_min_replicas) or "ok"
        except REDIS_UNAVAILABLE as exc:
            checks["redis"] = f"unreachable: {exc}"
        checks["triton"] = "ok" if await self.parts.backend.server_ready() else "not ready"
        try:
            models = await self.parts.backend.ready_models()
            ok = self.settings.default_model in models
            checks["default_model"] = "ok" if ok else f"{self.settings.default_model!r} not ready"
        except BackendError as exc:
            checks["default_model"] = f"unknown: {exc}"
        return all(v == "ok" for v in checks.values()), checks

    async def serving(self) -> bool:
        """Whether a request could be served now: Redis answers and Triton is ready (the
        Open Inference Protocol's server readiness)."""
        try:
            await self.parts.redis.ping()
        except REDIS_UNAVAILABLE:
            return False
        return await self.parts.backend.server_ready()

    async def circuits(self) -> dict[str, str]:
        """Each reported model's circuit breaker, and each of its versions' as
        ``<model>/<version>`` (with the model's fallback while not closed)."""
        circuits: dict[str, str] = {}
        for model, c in (await self.capacity.all()).items():
            states = [(model, c.breaker)] + [(f"{model}/{v}", state) for v, state, _ in c.versions]
            for name, state in states:
                circuits[name] = state + (f", fallback {c.fallback}" if c.fallback and
                                          state != "closed" else "")
        return circuits
