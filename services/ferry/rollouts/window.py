"""Per-version figures over sliding windows, mergeable across batchers. Pure code, no I/O.

Each batcher tallies the tasks it ends by (model, version, ``BUCKET_S``-second bucket):
requests and errors (a rollout's shadow copies among them, also counted apart), and two latency
histograms of the tasks that were not shadows, on fixed log-spaced bins (queue time: from
acceptance to the end, less Triton time; Triton time: the task's batch call). Each Triton call
is also tallied once, by its size class (rows 1, 2, 3-4, 5-8, ... 33-64, more), in a histogram
of its time per class and a sum of its rows: the guard compares versions' calls of like sizes
(``rollouts.latency``). A bucket's tally is added into one Redis hash per (model, version,
bucket) with HINCRBY, so any number of batchers merge exactly; a window's figures are the sum of
its buckets' hashes, and a quantile is read from the merged bins (the bin's upper edge: at most
``GROWTH`` - 1 = 20% high).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

BUCKET_S = 5  # seconds per tally bucket
FIRST_EDGE_S = 0.0005  # bin 0: up to 0.5 ms
GROWTH = 1.2  # each bin's upper edge is this times the last's
BINS = 80  # up to about 0.5 ms x 1.2^79: hours
KINDS = ("q", "t")  # queue time, Triton time
SIZE_CLASSES = 8  # calls of 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64 and more rows
Key = tuple[str, str, int]  # model, version, bucket start
Calls = dict[int, dict[int, int]]  # size class -> histogram bin -> calls


def size_class(rows: int) -> int:
    """The size class of a call of ``rows`` rows: 0 for 1 row, then one per doubling."""
    return min(SIZE_CLASSES - 1, max(0, math.ceil(math.log2(max(1, rows)))))


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
            triton_s: float, shadow: bool = False) -> None:
        """One task ended (a shadow's times are not its version's: it waited at batch
        priority)."""
        fields = self._of(model, version, now)
        fields["n"] += 1
        if error:
            fields["e"] += 1
        if shadow:
            fields["sn"] += 1
            return
        fields[f"q{bin_of(queue_s)}"] += 1
        if triton_s > 0:
            fields[f"t{bin_of(triton_s)}"] += 1

    def call(self, model: str, version: str, now: float, *, rows: int, seconds: float) -> None:
        """One Triton call of ``rows`` rows that took ``seconds``."""
        fields = self._of(model, version, now)
        klass = size_class(rows)
        fields[f"c{klass}.{bin_of(seconds)}"] += 1
        fields[f"r{klass}"] += rows

    def _of(self, model: str, version: str, now: float) -> dict[str, int]:
        key = (model, version, bucket_of(now))
        fields = self._fields.get(key)
        if fields is None:
            fields = self._fields[key] = defaultdict(int)
        return fields

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
class CallTimes:
    """A version's Triton calls by size class: each class's histogram of call times and its
    rows in all."""

    bins: Calls = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)

    def count(self, klass: int) -> int:
        return sum(self.bins.get(klass, {}).values())

    def mean_rows(self, klass: int) -> float:
        calls = self.count(klass)
        return self.rows.get(klass, 0) / calls if calls else 0.0

    @property
    def calls(self) -> int:
        return sum(sum(bins.values()) for bins in self.bins.values())


@dataclass(frozen=True)
class Figures:
    """One version's figures over a window; its calls over the whole window and per bucket."""

    requests: int = 0  # tasks it answered, shadow copies included
    errors: int = 0
    queue_p50_s: float = 0.0  # of the tasks that were not shadows
    queue_p99_s: float = 0.0
    triton_p50_s: float = 0.0
    triton_p99_s: float = 0.0
    shadows: int = 0  # of ``requests``, the shadow copies
    calls: CallTimes = field(default_factory=CallTimes)
    buckets: tuple[CallTimes, ...] = ()

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 6), "shadows": self.shadows,
                "calls": self.calls.calls,
                "queue_p50_ms": round(self.queue_p50_s * 1000, 2),
                "queue_p99_ms": round(self.queue_p99_s * 1000, 2),
                "triton_p50_ms": round(self.triton_p50_s * 1000, 2),
                "triton_p99_ms": round(self.triton_p99_s * 1000, 2)}


def figures(hashes: Iterable[Mapping[str, int]]) -> Figures:
    """One version's figures from its buckets' hashes (field name to count), oldest first."""
    counts: dict[str, int] = defaultdict(int)
    bins: dict[str, dict[int, int]] = {kind: defaultdict(int) for kind in KINDS}
    buckets = []
    for fields in hashes:
        calls = CallTimes()
        for name, count in fields.items():
            if name in ("n", "e", "sn"):
                counts[name] += count
            elif name[:1] in bins and name[1:].isdigit():
                bins[name[:1]][int(name[1:])] += count
            else:
                _add_call(calls, name, count)
        buckets.append(calls)
    queue, triton = bins["q"], bins["t"]
    return Figures(counts["n"], counts["e"], quantile(queue, 0.5), quantile(queue, 0.99),
                   quantile(triton, 0.5), quantile(triton, 0.99), counts["sn"],
                   _pooled(buckets), tuple(buckets))


def _add_call(calls: CallTimes, name: str, count: int) -> None:
    """Count a call field (``c<class>.<bin>``, ``r<class>``) into ``calls``; others are not."""
    kind, rest = name[:1], name[1:]
    if kind == "r" and rest.isdigit():
        calls.rows[int(rest)] = calls.rows.get(int(rest), 0) + count
    elif kind == "c":
        klass, _, index = rest.partition(".")
        if klass.isdigit() and index.isdigit():
            histogram = calls.bins.setdefault(int(klass), {})
            histogram[int(index)] = histogram.get(int(index), 0) + count


def _pooled(buckets: Iterable[CallTimes]) -> CallTimes:
    pooled = CallTimes()
    for calls in buckets:
        for klass, histogram in calls.bins.items():
            mine = pooled.bins.setdefault(klass, {})
            for index, count in histogram.items():
                mine[index] = mine.get(index, 0) + count
        for klass, rows in calls.rows.items():
            pooled.rows[klass] = pooled.rows.get(klass, 0) + rows
    return pooled


def buckets_between(start: float, end: float) -> list[int]:
    """The buckets a window [start, end] touches, oldest first."""
    first, last = bucket_of(start), bucket_of(end)
    return list(range(first, last + 1, BUCKET_S))
