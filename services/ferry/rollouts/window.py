"""Per-version figures over sliding windows, mergeable across batchers. Pure code, no I/O.

Each batcher tallies the tasks it ends by (model, version, ``BUCKET_S``-second bucket):
requests, errors, and two latency histograms on fixed log-spaced bins (queue time: from
acceptance to the end, less Triton time; Triton time: the task's batch call). A bucket's tally
is added into one Redis hash per (model, version, bucket) with HINCRBY, so any number of
batchers merge exactly; a window's figures are the sum of its buckets' hashes, and a quantile is
read from the merged bins (the bin's upper edge: at most ``GROWTH`` - 1 = 20% high).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

BUCKET_S = 5  # seconds per tally bucket
FIRST_EDGE_S = 0.0005  # bin 0: up to 0.5 ms
GROWTH = 1.2  # each bin's upper edge is this times the last's
BINS = 80  # up to about 0.5 ms x 1.2^79: hours
KINDS = ("q", "t")  # queue time, Triton time
Key = tuple[str, str, int]  # model, version, bucket start


def bin_of(seconds: float) -> int:
    """The histogram bin of a duration."""
    if seconds <= FIRST_EDGE_S:
        return 0
    return min(BINS - 1, math.ceil(math.log(seconds / FIRST_EDGE_S, GROWTH)))


def upper_edge(index: int) -> float:
    return FIRST_EDGE_S * GROWTH ** index


def quantile(bins: Mapping[int, int], q: float) -> float:
    """The ``q`` quantile (0-1) of a histogram, as its bin's upper edge; 0 for none."""
    total = sum(bins.values())
    if total <= 0:
        return 0.0
    rank, seen = q * total, 0
    for index in sorted(bins):
        seen += bins[index]
        if seen >= rank:
            return upper_edge(index)
    return upper_edge(max(bins))


def bucket_of(now: float) -> int:
    return int(now // BUCKET_S) * BUCKET_S


class Tally:
    """What a batcher has ended since its last flush, by (model, version, bucket)."""

    def __init__(self) -> None:
        self._fields: dict[Key, dict[str, int]] = {}

    def add(self, model: str, version: str, now: float, *, error: bool, queue_s: float,
            triton_s: float) -> None:
        key = (model, version, bucket_of(now))
        fields = self._fields.get(key)
        if fields is None:
            fields = self._fields[key] = defaultdict(int)
        fields["n"] += 1
        if error:
            fields["e"] += 1
        fields[f"q{bin_of(queue_s)}"] += 1
        if triton_s > 0:
            fields[f"t{bin_of(triton_s)}"] += 1

    def drain(self) -> dict[Key, dict[str, int]]:
        """Everything tallied, forgotten here (a failed flush adds it back with ``merge``)."""
        drained, self._fields = self._fields, {}
        return drained

    def merge(self, drained: Mapping[Key, Mapping[str, int]]) -> None:
        for key, fields in drained.items():
            mine = self._fields.setdefault(key, defaultdict(int))
            for name, count in fields.items():
                mine[name] += count

    def __len__(self) -> int:
        return len(self._fields)


@dataclass(frozen=True)
class Figures:
    """One version's figures over a window."""

    requests: int = 0
    errors: int = 0
    queue_p50_s: float = 0.0
    queue_p99_s: float = 0.0
    triton_p50_s: float = 0.0
    triton_p99_s: float = 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 6),
                "queue_p50_ms": round(self.queue_p50_s * 1000, 2),
                "queue_p99_ms": round(self.queue_p99_s * 1000, 2),
                "triton_p50_ms": round(self.triton_p50_s * 1000, 2),
                "triton_p99_ms": round(self.triton_p99_s * 1000, 2)}


def figures(hashes: Iterable[Mapping[str, int]]) -> Figures:
    """One version's figures from its buckets' hashes (field name to count)."""
    requests = errors = 0
    bins: dict[str, dict[int, int]] = {kind: defaultdict(int) for kind in KINDS}
    for fields in hashes:
        for name, count in fields.items():
            if name == "n":
                requests += count
            elif name == "e":
                errors += count
            elif name[:1] in bins and name[1:].isdigit():
                bins[name[:1]][int(name[1:])] += count
    queue, triton = bins["q"], bins["t"]
    return Figures(requests, errors, quantile(queue, 0.5), quantile(queue, 0.99),
                   quantile(triton, 0.5), quantile(triton, 0.99))


def buckets_between(start: float, end: float) -> list[int]:
    """The buckets a window [start, end] touches, oldest first."""
    first, last = bucket_of(start), bucket_of(end)
    return list(range(first, last + 1, BUCKET_S))
