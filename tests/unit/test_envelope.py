"""The one place a task is made (``tasks.envelope``), the limits of the one way in
(``tasks.admission``) and the table of a job's moves: pure rules, no servers."""

from __future__ import annotations

import asyncio

import pytest

from ferry import keys
from ferry.errors import ServiceUnavailableError
from ferry.jobs.model import TRANSITIONS, JobStatus, moving, sources
from ferry.priority import Priority
from ferry.submission import Submission
from ferry.tasks.admission import FixedLimits
from ferry.tasks.base import NOT_SHARED, Admission, input_digest
from ferry.tasks.envelope import Rules, Tensors, new_task, review_of, shadow_of, timeout_of
from ferry.tensors import Tensor

ASKED = Submission(model="sim", payload=b"hello", content_type="text/plain", client_id="c1",
                   priority=Priority.HIGH, timeout_s=2.5, callback_url="https://x.test/h")


def test_a_request_makes_its_task_record_and_sharing() -> None:
    cached = Rules(default_timeout_s=0, cache_ttl_s=300, collapse_requests=True, partitions=16)
    task, pending, sharing = new_task("sim", "1", ASKED, cached)
    assert (task.model, task.payload, task.client_id, task.priority) == \
        ("sim", b"hello", "c1", int(Priority.HIGH))
    assert timeout_of(task) == 2.5 and task.deadline_ms == task.enqueued_at_ms + 2500
    assert sharing.digest == input_digest("sim", "1", b"hello") == task.input_digest
    assert sharing.lookup and not sharing.collapse  # a deadline of its own: never collapsed
    assert keys.partition_of(task.task_id, 16) == keys.partition_of_digest(sharing.digest, 16)
    assert (pending.task_id, pending.model) == (task.task_id, "sim")
    plain = new_task("sim", "", Submission(model="sim", payload=b"x", content_type=""),
                     Rules(default_timeout_s=7))
    assert plain.sharing is NOT_SHARED and timeout_of(plain.task) == 7


def test_a_tensor_request_carries_its_inputs_version_and_digest() -> None:
    tensors = Tensors([Tensor("INPUT0", "FP32", (1, 4), bytes(16))], ["OUTPUT0"], "req-1", "2",
                      "ab" * 32)
    task, _, sharing = new_task("simple", "2", ASKED, Rules(cache_ttl_s=60), tensors)
    assert (task.model_version, task.request_id, list(task.outputs)) == ("2", "req-1",
                                                                          ["OUTPUT0"])
    assert [(t.name, list(t.shape), len(t.contents)) for t in task.inputs] == \
        [("INPUT0", [1, 4], 16)]
    assert sharing.digest == "ab" * 32


def test_shadows_and_reviews_are_batch_work_of_their_own() -> None:
    task = new_task("sim", "1", ASKED, Rules(cache_ttl_s=60)).task
    shadow = shadow_of(task, "2").task
    assert (shadow.shadow_of, shadow.model_version, shadow.priority) == \
        (task.task_id, "2", int(Priority.BATCH))
    assert shadow.task_id != task.task_id and not shadow.client_id and not shadow.callback_url
    assert timeout_of(shadow) == 0 and not shadow.input_digest
    review = review_of(task, "big", "3").task
    assert (review.model, review.model_version, review.review_of, review.review_webhook) == \
        ("big", "3", task.task_id, "https://x.test/h")
    assert review.priority == int(Priority.BATCH) and review.payload == b"hello"


def test_fixed_limits_are_the_same_for_every_kind() -> None:
    fixed = Admission(limit=50, partitions=16)
    found = asyncio.run(FixedLimits(fixed).admission("m", "1", Priority.BATCH, 0.0))
    assert found is fixed


def test_a_job_moves_only_as_its_table_says() -> None:
    assert sources(JobStatus.CANCELLING) == [JobStatus.QUEUED, JobStatus.RUNNING]
    assert set(sources(JobStatus.FINALIZING)) == {JobStatus.QUEUED, JobStatus.RUNNING,
                                                  JobStatus.CANCELLING}
    assert moving(JobStatus.FAILED, JobStatus.QUEUED) == [JobStatus.FAILED]  # a retry
    with pytest.raises(ValueError, match="running to queued"):
        moving(JobStatus.RUNNING, JobStatus.QUEUED)
    assert set(TRANSITIONS) == set(JobStatus)  # every state is in the table
    assert all(not final.final or targets == (JobStatus.QUEUED,)
               for final, targets in TRANSITIONS.items())


def test_an_open_breaker_is_refused_with_its_version_named() -> None:
    from ferry.tasks.admission import _refuse_open
    from ferry.tasks.capacity import Capacity

    capacity = Capacity(10, 0.1, "closed", "", 0.0, (("3", "open", 12.0),))
    _refuse_open("m", "1", capacity)
    with pytest.raises(ServiceUnavailableError) as refused:
        _refuse_open("m", "3", capacity)
    assert refused.value.code == "circuit_open" and "version 3" in refused.value.message
