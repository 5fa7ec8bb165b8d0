"""Triton's scheduling parameters as Ferry's, and what identical tensor requests share."""

from __future__ import annotations

import pytest

from ferry.oip.schedule import TensorTask, priority_of, schedule, timeout_of
from ferry.oip.spec import CheckedRequest
from ferry.priority import Priority
from ferry.tensors import Tensor, TensorError


@pytest.mark.parametrize(("level", "priority"), [(0, Priority.NORMAL), (1, Priority.HIGH),
                                                 (2, Priority.NORMAL), (3, Priority.LOW),
                                                 (99, Priority.LOW)])
def test_triton_priority_levels_map_onto_three(level: int, priority: Priority) -> None:
    assert priority_of(level) is priority


def test_timeout_is_microseconds_and_zero_is_none() -> None:
    assert timeout_of(0) is None
    assert timeout_of(1_500_000) == 1.5
    with pytest.raises(TensorError, match="more than a day"):
        timeout_of(86_400_000_001)


@pytest.mark.parametrize(("parameters", "reason"), [
    ({"sequence_id": 3}, "sequences"), ({"custom": 1}, "'custom' is not supported"),
    ({"priority": -1}, "'priority'"), ({"timeout": 1.5}, "'timeout'"),
    ({"priority": True}, "'priority'")])
def test_what_cannot_be_scheduled_is_refused(parameters: dict[str, object], reason: str) -> None:
    with pytest.raises(TensorError, match=reason):
        schedule(parameters)


def test_schedule_reads_both() -> None:
    assert schedule({"priority": 1, "timeout": 2_000_000, "binary_data_output": True}) == (
        Priority.HIGH, 2.0)
    assert schedule({}) == (Priority.NORMAL, None)


def _task(raw: bytes, outputs: tuple[str, ...] = (), version: str = "") -> TensorTask:
    tensor = Tensor("X", "UINT8", (1, len(raw)), raw)
    return TensorTask(CheckedRequest("m", version, (tensor,), outputs, 1, True))


def test_the_digest_keys_on_version_bytes_and_outputs_not_their_order() -> None:
    base = _task(b"ab", ("A", "B"))
    assert base.digest == _task(b"ab", ("B", "A")).digest
    assert len({base.digest, _task(b"ac", ("A", "B")).digest, _task(b"ab", ("A",)).digest,
                _task(b"ab", ("A", "B"), "2").digest}) == 4


def test_a_refused_parameter_is_told_every_one_ferry_takes() -> None:
    with pytest.raises(TensorError) as refused:
        schedule({"custom": 1})
    assert str(refused.value) == (
        "parameter 'custom' is not supported (Ferry takes binary_data_output, priority, "
        "timeout, and over gRPC respond_async; it ignores triton_enable_empty_final_response)")
