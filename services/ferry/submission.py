"""What a client asked for: a submission, checked for form (by ``gateway.intake``, or made from
a bulk job's item by ``jobs.items``) but not yet against its model. Below the gateway, so that
the jobs engine and the gateway share it."""

from __future__ import annotations

from dataclasses import dataclass

from ferry.oip.request import InferRequest
from ferry.priority import Priority


@dataclass(frozen=True)
class TensorForm:
    """A tensor form's infer request, read but not yet checked against the model, and the
    version it asks for ('': the model's newest)."""

    request: InferRequest
    version: str = ""


@dataclass(frozen=True)
class Submission:
    """What a client asked for, checked for form but not yet against the model."""

    model: str | None
    payload: bytes
    content_type: str
    client_id: str = ""
    priority: Priority = Priority.NORMAL
    timeout_s: float | None = None  # the client's deadline, seconds from admission
    no_cache: bool = False  # Cache-Control: no-cache: do not answer from the result cache
    callback_url: str = ""  # where to POST the final record (checked against the allowlist)
    version: str = ""  # the model version asked for ('': the rollout's, or Triton's policy's)
    rollout_key: str = ""  # what a rollout's sticky split keys on ('': the client id)


@dataclass(frozen=True, kw_only=True)
class TensorSubmission(Submission):
    """The tensor form's submission: its request in place of a payload. (A subclass, not a
    field of every submission: a frozen dataclass pays for each field it sets, on every
    request.)"""

    tensors: TensorForm
