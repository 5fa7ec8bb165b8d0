"""Partition ownership by StatefulSet ordinal, for every replica count."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ferry.batcher.replicas import StatefulSetReplicas, pod_namespace
from ferry.rules.ownership import as_spec, ordinal_of, spread
from ferry.settings import parse_partitions


@pytest.mark.parametrize("partitions", [1, 7, 16, 64])
def test_every_partition_is_owned_exactly_once_for_every_replica_count(partitions: int) -> None:
    for replicas in range(1, partitions + 1):
        owned = [p for ordinal in range(replicas) for p in spread(ordinal, replicas, partitions)]
        assert sorted(owned) == list(range(partitions)), replicas
        sizes = {len(spread(o, replicas, partitions)) for o in range(replicas)}
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1  # balanced, none idle


def test_a_replica_beyond_the_count_owns_nothing() -> None:
    assert spread(4, 4, 16) == () and spread(0, 20, 16) == (0,) and spread(17, 20, 16) == ()
    with pytest.raises(ValueError):
        spread(0, 0, 16)


def test_ordinals_come_from_statefulset_pod_names() -> None:
    assert ordinal_of("ferry-batcher-0") == 0 and ordinal_of("ferry-batcher-12") == 12
    assert ordinal_of("ferry-batcher") is None and ordinal_of("laptop") is None


def test_a_spread_is_a_partition_setting() -> None:
    owned = spread(1, 3, 16)
    assert parse_partitions(as_spec(owned), 16) == owned == (1, 4, 7, 10, 13)


class _StatefulSets:
    """What ``AppsV1Api.read_namespaced_stateful_set`` answers, for a test without a cluster."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.asked: list[tuple[str, str]] = []

    def read_namespaced_stateful_set(self, name: str, namespace: str) -> SimpleNamespace:
        self.asked.append((name, namespace))
        return SimpleNamespace(spec=SimpleNamespace(replicas=self.replicas))


async def test_the_replica_count_is_the_statefulsets(tmp_path: Path) -> None:
    api = _StatefulSets(3)
    count = StatefulSetReplicas("ferry-batcher", "inference", api=api)
    assert await count() == 3
    api.replicas = 5
    assert await count() == 5
    assert api.asked == [("ferry-batcher", "inference")] * 2
    namespace = tmp_path / "namespace"
    namespace.write_text("ml-serving\n")
    assert pod_namespace(namespace) == "ml-serving"
    assert pod_namespace(tmp_path / "missing") == "default"
