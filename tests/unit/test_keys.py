"""Redis key naming, task ids and partitioning."""

from __future__ import annotations

from collections import Counter

import pytest

from ferry import keys
from ferry.priority import Priority


def test_fixed_names() -> None:
    assert keys.PREFIX == "ferry"
    assert keys.CONSUMER_GROUP == "ferry-batchers"
    assert keys.DONE_CHANNEL == "ferry:done"
    assert keys.TASK_FIELD == "task"


def test_partition_names_carry_the_partitions_hash_tag() -> None:
    assert keys.partition_stream(0) == "ferry:{p0}:tasks"
    assert keys.partition_stream(15) == "ferry:{p15}:tasks"
    assert keys.dead_letter_stream(3) == "ferry:{p3}:dead"
    assert keys.backlog_key(3) == "ferry:{p3}:backlog"


def test_each_priority_has_its_stream_most_urgent_first() -> None:
    assert keys.partition_stream(2, Priority.HIGH) == "ferry:{p2}:tasks:high"
    assert keys.partition_stream(2, Priority.NORMAL) == "ferry:{p2}:tasks"
    assert keys.partition_stream(2, Priority.LOW) == "ferry:{p2}:tasks:low"
    assert keys.partition_streams(2) == ["ferry:{p2}:tasks:high", "ferry:{p2}:tasks",
                                         "ferry:{p2}:tasks:low", "ferry:{p2}:tasks:batch"]
    assert keys.backlog_field("sim", Priority.LOW) == "sim|-1"


def test_task_key_name() -> None:
    task_id = "0123456789abcdef0123456789abcdef"
    assert keys.task_key(task_id, 7) == f"ferry:{{p7}}:task:{task_id}"


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes: the part between the first { and the next }."""
    start = key.index("{")
    return key[start + 1:key.index("}", start)]


def test_everything_about_a_task_lives_in_its_partitions_slot() -> None:
    task_id = keys.new_task_id()
    partition = keys.partition_of(task_id, 16)
    names = [keys.task_key(task_id, partition), *keys.partition_streams(partition),
             keys.dead_letter_stream(partition), keys.backlog_key(partition)]
    assert {hash_tag(name) for name in names} == {f"p{partition}"}


def test_partitions_have_distinct_hash_tags() -> None:
    assert len({hash_tag(keys.partition_stream(p)) for p in range(64)}) == 64


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


def test_partition_of_is_the_leading_digits_modulo() -> None:
    task_id = "0123456789abcdef0123456789abcdef"
    assert keys.partition_of(task_id, 16) == 0x01234567 % 16
    assert keys.partition_of(task_id, 1) == 0


@pytest.mark.parametrize("partitions", [1, 3, 16, 64])
def test_an_id_can_be_aimed_at_a_partition(partitions: int) -> None:
    for partition in range(partitions):
        for _ in range(50):
            task_id = keys.new_task_id(partition, partitions)
            assert keys.is_task_id(task_id)
            assert keys.partition_of(task_id, partitions) == partition
    assert len({keys.new_task_id(2, 16) for _ in range(1000)}) == 1000


def test_identical_requests_share_a_partition_and_its_slot() -> None:
    digest = "9f" * 32
    partition = keys.partition_of_digest(digest, 16)
    task_id = keys.new_task_id(partition, 16)
    names = [keys.task_key(task_id, partition), keys.cache_key(partition, digest),
             keys.followers_key(partition, task_id)]
    assert {hash_tag(name) for name in names} == {f"p{partition}"}


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


def test_a_task_id_ends_with_the_tag_of_the_process_that_made_it() -> None:
    tag = keys.process_tag()
    assert len(tag) == keys.ANNOUNCE_TAG_LENGTH and int(tag, 16) >= 0
    for task_id in (keys.new_task_id(), keys.new_task_id(5, 16)):
        assert keys.is_task_id(task_id)
        assert keys.announce_tag(task_id) == tag
    assert keys.partition_of(keys.new_task_id(5, 16), 16) == 5
    assert keys.done_channel(tag) == f"ferry:done:{tag}"


def test_a_forked_process_draws_a_tag_of_its_own() -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        tags = set(pool.map(_tag_in_child, range(8)))
    assert keys.process_tag() not in tags  # alike by chance: 1 in 65,536 per child
    assert all(len(tag) == keys.ANNOUNCE_TAG_LENGTH for tag in tags)


def _tag_in_child(_: int) -> str:
    return keys.process_tag()
