"""Which partitions each batcher replica owns: pure, so it is proven for every replica count.

Replica ``i`` of ``n`` (a StatefulSet ordinal) owns the partitions ``p`` with ``p % n == i``:
every partition exactly once for any ``n`` from 1 to the partition count, and a replica whose
ordinal is ``n`` or more (being scaled away) owns none.
"""

from __future__ import annotations

import re

_ORDINAL = re.compile(r"-(\d+)$")


def spread(ordinal: int, replicas: int, partitions: int) -> tuple[int, ...]:
    """The partitions replica ``ordinal`` of ``replicas`` owns."""
    if replicas < 1 or ordinal < 0:
        raise ValueError("replicas must be >= 1 and the ordinal >= 0")
    return tuple(p for p in range(partitions) if p % replicas == ordinal)


def ordinal_of(pod_name: str) -> int | None:
    """A StatefulSet pod's ordinal, from its name (``ferry-batcher-3`` → 3); None if it has
    none."""
    found = _ORDINAL.search(pod_name)
    return int(found.group(1)) if found else None


def as_spec(partitions: tuple[int, ...]) -> str:
    """The ``owned_partitions`` setting naming exactly these partitions."""
    return ",".join(map(str, partitions))
