"""A submission checked against its model and made into its task's envelope: the model
resolved, its version picked, the payload or the tensors checked (a 4xx saying what is wrong,
nothing admitted), the envelope made (``tasks.envelope``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple

from ferry.errors import BackendError, BadRequestError, NotFoundError
from ferry.gateway.catalog import ModelCatalog
from ferry.gateway.intake import check_payload
from ferry.gateway.versions import Versions
from ferry.oip.schedule import TensorTask
from ferry.rollouts.rollout import Sticky
from ferry.submission import Submission, TensorSubmission
from ferry.tasks import idempotency
from ferry.tasks.capacity import CapacityBoard
from ferry.tasks.envelope import Envelope, Rules, Tensors, new_task
from ferry.telemetry.tracing import Tracing
from ferry.tensors import TensorError

TENSOR_FORM = "tensors"  # an idempotency digest's content type for /v1's tensor form


class Prepared(NamedTuple):
    """A checked submission's envelope, and its idempotency digest (made when asked for)."""

    envelope: Envelope
    digest: Callable[[], str]


def tensor_parts(tensors: TensorTask) -> Tensors:
    """A checked tensor request's part of its task."""
    checked = tensors.request
    return Tensors(checked.inputs, checked.outputs, tensors.request_id, checked.version,
                   tensors.digest)


class Preparer:
    """Makes envelopes of submissions and of the protocol's checked requests."""

    def __init__(self, catalog: ModelCatalog, versions: Versions, capacity: CapacityBoard, *,
                 rules: Rules, tracing: Tracing, default_model: str) -> None:
        self.catalog = catalog
        self.versions = versions
        self.capacity = capacity
        self.rules = rules
        self.tracing = tracing
        self.default_model = default_model

    async def prepare(self, submission: Submission) -> Prepared:
        """The envelope a submission makes, checked against its model."""
        if isinstance(submission, TensorSubmission):
            return await self._prepare_tensors(submission)
        spec = await self.catalog.resolve(submission.model or self.default_model)
        version = submission.version
        if version or spec.default_version or self.versions.may_pick(spec.name):
            version = await self.version_for(spec.name, version, Sticky(
                submission.client_id, submission.rollout_key))
        if spec.input_kind == "image":
            await asyncio.to_thread(check_payload, spec.input_kind, submission.payload)
        else:
            check_payload(spec.input_kind, submission.payload)
        envelope = self.envelope(spec.name, version or spec.version, submission)
        envelope.task.model_version = version
        task = envelope.task
        return Prepared(envelope, lambda: idempotency.request_digest(
            spec.name, task.priority, task.content_type, task.payload, submission.version))

    def envelope(self, model: str, version: str, submission: Submission,
                 tensors: TensorTask | None = None) -> Envelope:
        """The task's envelope (traced from here when tracing is on)."""
        envelope = new_task(model, version, submission, self.rules,
                            tensor_parts(tensors) if tensors is not None else None)
        if self.tracing.enabled:
            self.tracing.inject(envelope.task.trace_context)
        return envelope

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
        model = submission.model or self.default_model
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
        envelope = self.envelope(checked.model, tensors.version, submission, tensors)
        task = envelope.task
        return Prepared(envelope, lambda: idempotency.request_digest(
            checked.model, task.priority, TENSOR_FORM, tensors.request_digest.encode(), asked))
