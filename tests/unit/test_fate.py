"""The fate rules: what becomes of a batch after a failure, and of a task that must not be
inferred. Pure: no servers, no clock."""

from __future__ import annotations

import pytest

from ferry.rules.fate import (
    Attempt,
    Failure,
    Fate,
    after_failure,
    after_inference,
    before_inference,
    due_ms,
    is_expired,
)
from ferry.tasks.record import Status


def at(size: int = 4, attempt: int = 1, max_attempts: int = 3, budget: bool = True) -> Attempt:
    return Attempt(size, attempt, max_attempts, budget)


@pytest.mark.parametrize(
    ("failure", "attempt", "expected"),
    [
        (Failure.UNREACHABLE, at(), Fate.WAIT),  # an outage spends no attempt...
        (Failure.UNREACHABLE, at(attempt=3), Fate.WAIT),  # ...however many were spent
        (Failure.UNREACHABLE, at(budget=False), Fate.FAIL),  # until its budget is gone
        (Failure.TRANSIENT, at(attempt=1), Fate.RETRY),
        (Failure.TRANSIENT, at(attempt=2), Fate.RETRY),
        (Failure.TRANSIENT, at(attempt=3), Fate.FAIL),
        (Failure.PERMANENT, at(size=2), Fate.SPLIT),  # isolate the bad request
        (Failure.PERMANENT, at(size=1, attempt=1), Fate.RETRY),  # alone: retried, then failed
        (Failure.PERMANENT, at(size=1, attempt=3), Fate.FAIL),
        (Failure.UNKNOWN_MODEL, at(size=8), Fate.RETRY),  # reloading: whole, not split
        (Failure.UNKNOWN_MODEL, at(size=8, attempt=3), Fate.FAIL),
        (Failure.CONTRACT, at(attempt=1), Fate.FAIL),  # nothing can help
        (Failure.CIRCUIT_OPEN, at(attempt=1), Fate.FAIL),
    ],
)
def test_after_failure(failure: Failure, attempt: Attempt, expected: Fate) -> None:
    assert after_failure(failure, attempt) is expected


def test_one_attempt_allowed_means_no_retry() -> None:
    assert after_failure(Failure.TRANSIENT, at(attempt=1, max_attempts=1)) is Fate.FAIL


def test_a_wanted_task_is_inferred() -> None:
    assert before_inference(deadline_ms=0, now_ms=10**13) is None
    assert before_inference(deadline_ms=2000, now_ms=1999, deliveries=5, max_deliveries=5) is None


def test_an_expired_task_expires_with_a_reason() -> None:
    status, reason = before_inference(deadline_ms=1000, now_ms=1000) or (None, "")
    assert status is Status.EXPIRED
    assert "deadline" in reason


def test_cancel_wins_over_expiry_and_expiry_over_redelivery() -> None:
    verdict = before_inference(deadline_ms=1, now_ms=2, cancelled=True, deliveries=9)
    assert verdict is not None and verdict[0] is Status.CANCELLED
    verdict = before_inference(deadline_ms=1, now_ms=2, deliveries=9, max_deliveries=5)
    assert verdict is not None and verdict[0] is Status.EXPIRED


def test_a_task_delivered_too_often_fails() -> None:
    verdict = before_inference(deadline_ms=0, now_ms=1, deliveries=6, max_deliveries=5)
    assert verdict is not None
    assert verdict[0] is Status.FAILED and "delivered 6 times" in verdict[1]


@pytest.mark.parametrize(
    ("deadline_ms", "now_ms", "expected"),
    [
        (0, 10**15, False),  # no deadline
        (-1, 10**15, False),
        (1000, 999, False),
        (1000, 1000, True),
        (1000, 1001, True),
    ],
)
def test_is_expired(deadline_ms: int, now_ms: int, expected: bool) -> None:
    assert is_expired(deadline_ms, now_ms) is expected


def test_a_task_whose_deadline_would_pass_during_the_call_expires_now() -> None:
    verdict = before_inference(deadline_ms=1_050, now_ms=1_000, call_ms=66)
    assert verdict is not None and verdict[0] is Status.EXPIRED
    assert "during inference" in verdict[1] and "66 ms" in verdict[1] and "50 ms" in verdict[1]
    assert before_inference(deadline_ms=1_100, now_ms=1_000, call_ms=66) is None


def test_a_task_is_due_by_its_deadline_or_its_submission_plus_the_slo_the_earlier() -> None:
    assert due_ms(deadline_ms=0, enqueued_at_ms=1_000, slo_ms=0) is None
    assert due_ms(deadline_ms=5_000, enqueued_at_ms=1_000, slo_ms=0) == 5_000
    assert due_ms(deadline_ms=0, enqueued_at_ms=1_000, slo_ms=200) == 1_200
    assert due_ms(deadline_ms=5_000, enqueued_at_ms=1_000, slo_ms=200) == 1_200
    assert due_ms(deadline_ms=1_100, enqueued_at_ms=1_000, slo_ms=200) == 1_100


def test_an_answer_after_its_deadline_is_not_the_tasks() -> None:
    assert after_inference(deadline_ms=0, finished_at=5.0) is None  # no deadline
    assert after_inference(deadline_ms=5_000, finished_at=4.999) is None
    assert after_inference(deadline_ms=5_000, finished_at=5.0) is None  # by it, just
    late = after_inference(deadline_ms=5_000, finished_at=5.25)
    assert late == "deadline passed during inference: the answer came 250 ms after it"
