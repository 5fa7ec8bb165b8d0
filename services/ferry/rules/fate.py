"""What becomes of tasks that cannot simply be inferred: the one place that decides.

Pure functions over plain values, like the batching policy: the executor classifies what happened
(an exception, Triton's liveness, the clock) and carries out the decision; which failures are
worth retrying, when a batch is split, when a task expires and when it fails for good is decided
here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ferry.tasks.record import Status

CANCELLED = "cancelled by the client before inference"


class Failure(StrEnum):
    """What kind of failure an infer call met."""

    UNREACHABLE = "unreachable"  # Triton is not live: an outage, not the requests' fault
    TRANSIENT = "transient"  # overloaded, timed out, connection dropped: the same call may work
    PERMANENT = "permanent"  # Triton answered and refused the batch: one request may be bad
    UNKNOWN_MODEL = "unknown_model"  # the model is not loaded (it may be reloading)
    CONTRACT = "contract"  # the model does not follow Ferry's contract: nothing can help
    CIRCUIT_OPEN = "circuit_open"  # the model's circuit breaker refuses calls for now


class Fate(StrEnum):
    """What to do with a batch after a failure."""

    WAIT = "wait"  # wait for Triton to come back, spending no attempt
    RETRY = "retry"  # the same batch again, after a backoff, spending an attempt
    SPLIT = "split"  # halves, each on its own, to isolate the request that fails
    FAIL = "fail"  # final: FAILED with the error, and a dead letter


@dataclass(frozen=True)
class Attempt:
    """Where a batch stands when its call failed."""

    size: int  # requests in the batch
    attempt: int  # 1 for the first call
    max_attempts: int
    outage_budget_left: bool = True  # an outage may still be waited out


def after_failure(failure: Failure, at: Attempt) -> Fate:
    """The batch's fate after ``failure``."""
    if failure in (Failure.CONTRACT, Failure.CIRCUIT_OPEN):
        return Fate.FAIL
    if failure is Failure.UNREACHABLE:
        return Fate.WAIT if at.outage_budget_left else Fate.FAIL
    if failure is Failure.PERMANENT and at.size > 1:
        return Fate.SPLIT  # an unknown model is retried whole: splitting cannot help it
    return Fate.RETRY if at.attempt < at.max_attempts else Fate.FAIL


def counts_against_model(failure: Failure, decided: Fate) -> bool:
    """Whether a failed call counts toward the model's circuit breaker: not an outage (Triton
    unreachable is waited out), and not a batch split to isolate a bad request (its halves'
    calls count)."""
    return failure is not Failure.UNREACHABLE and decided is not Fate.SPLIT


def before_inference(*, deadline_ms: int, now_ms: int, call_ms: int = 0, cancelled: bool = False,
                     deliveries: int = 1, max_deliveries: int = 1) -> tuple[Status, str] | None:
    """A final status for a task that must not reach Triton, with the reason; None: infer it.

    Checked when a task boards, when its batch leaves, and again before every retry. A task whose
    deadline would pass during the call (``call_ms``, the fitted time of its batch) expires now:
    its answer would come too late to be wanted, and the GPU is better spent on another.
    """
    if cancelled:
        return Status.CANCELLED, CANCELLED
    if is_expired(deadline_ms, now_ms):
        return Status.EXPIRED, "deadline passed before inference"
    if is_expired(deadline_ms, now_ms + call_ms):
        return Status.EXPIRED, (f"deadline would pass during inference (a call takes about "
                                f"{call_ms} ms, {deadline_ms - now_ms} ms were left)")
    if deliveries > max_deliveries:
        return Status.FAILED, (f"delivered {deliveries} times without finishing (limit "
                               f"{max_deliveries}); a batcher may crash on it")
    return None


def after_inference(*, deadline_ms: int, finished_at: float) -> str | None:
    """Why an answer written at ``finished_at`` (Unix seconds) is not the task's: its deadline
    passed while it was inferred (the fitted time was short, or the machine slow); None: it is
    in time. A task ends SUCCESS only by its deadline: whoever waited has been answered EXPIRED
    at it (``ferry.tasks.waiters.final_by``), and the record must say the same."""
    late_ms = finished_at * 1000.0 - deadline_ms
    if deadline_ms <= 0 or late_ms <= 0:
        return None
    return f"deadline passed during inference: the answer came {late_ms:.0f} ms after it"


def due_ms(*, deadline_ms: int, enqueued_at_ms: int, slo_ms: float) -> float | None:
    """When a task should be answered, Unix ms: its deadline or its submission plus the SLO,
    the earlier; None when it has neither (``deadline_ms`` 0, ``slo_ms`` 0)."""
    dues = [float(deadline_ms)] if deadline_ms else []
    if slo_ms:
        dues.append(enqueued_at_ms + slo_ms)
    return min(dues) if dues else None


def is_expired(deadline_ms: int, now_ms: int) -> bool:
    """A request with a deadline (``deadline_ms`` > 0) that has passed is no longer wanted."""
    return 0 < deadline_ms <= now_ms
