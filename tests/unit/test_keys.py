"""Redis key naming, task ids and partitioning."""

from __future__ import annotations

import zlib
from collections import Counter

import pytest

from ferry import keys


def test_fixed_names() -> None:
    assert keys.PREFIX == "ferry"
    assert keys.CONSUMER_GROUP == "ferry-batchers"
    assert keys.DEAD_LETTER_STREAM == "ferry:dead"
    assert keys.RESULT_CHANNEL == "ferry:results:done"
    assert keys.TASK_FIELD == "task"


def test_partition_stream_name() -> None:
    assert keys.partition_stream(0) == "ferry:tasks:0"
    assert keys.partition_stream(15) == "ferry:tasks:15"


def test_result_key_name() -> None:
    task_id = "0123456789abcdef0123456789abcdef"
    assert keys.result_key(task_id) == f"ferry:result:{task_id}"


def test_new_task_id_is_32_lowercase_hex_chars() -> None:
    task_id = keys.new_task_id()
    assert len(task_id) == 32
    assert set(task_id) <= set("0123456789abcdef")
    assert keys.is_task_id(task_id) is True


def test_new_task_ids_are_unique() -> None:
    ids = {keys.new_task_id() for _ in range(10_000)}
    assert len(ids) == 10_000


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0123456789abcdef0123456789abcdef", True),
        ("ffffffffffffffffffffffffffffffff", True),
        ("0123456789ABCDEF0123456789ABCDEF", False),  # upper case
        ("0123456789abcdef0123456789abcde", False),  # 31
        ("0123456789abcdef0123456789abcdef0", False),  # 33
        ("0123456789abcdef0123456789abcdeg", False),
        ("0123456789abcdef0123456789abcdef\n", False),
        ("", False),
        ("../../etc/passwd", False),
    ],
)
def test_is_task_id(value: str, expected: bool) -> None:
    assert keys.is_task_id(value) is expected


def test_partition_of_is_crc32_modulo() -> None:
    task_id = "0123456789abcdef0123456789abcdef"
    assert keys.partition_of(task_id, 16) == zlib.crc32(task_id.encode()) % 16
    assert keys.partition_of(task_id, 1) == 0


def test_partition_of_is_reproducible() -> None:
    task_id = keys.new_task_id()
    assert keys.partition_of(task_id, 7) == keys.partition_of(task_id, 7)


@pytest.mark.parametrize("partitions", [1, 3, 16, 64])
def test_partition_of_in_range_and_spread_over_all(partitions: int) -> None:
    counts = Counter(keys.partition_of(keys.new_task_id(), partitions) for _ in range(20_000))
    assert set(counts) == set(range(partitions))
    expected = 20_000 / partitions
    # crc32 over random ids is close to uniform: every partition within 30% of its share
    assert all(0.7 * expected <= n <= 1.3 * expected for n in counts.values())
