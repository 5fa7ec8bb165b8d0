"""Is a candidate's Triton time worse than its stable version's? Like against like, beyond the
stable's own noise. Pure code, no I/O.

A small share's batches are small, a shadow's wait at batch priority, and one slow call in fifty
is a 2-core machine's scheduler, not a model: a candidate's p99 against the stable's rolled back
an identical version (issue 32). So the guard compares the **typical call** (the median) of each
size class (``window.size_class``) the candidate has, against the stable's median of the same
class; where the stable has too few calls of that class, against the stable's t(B) fitted over
its classes (a line through each class's median at its mean rows). The candidate's ratio is the
geometric mean over its classes, weighted by its calls. The stable's **noise** is the same ratio
for each of its own buckets against its whole window: the worst of them is how much slower the
stable looks than itself over a few seconds. Shadows are apart (not tallied as calls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ferry.rollouts.window import CallTimes, Figures, quantile

MIN_CLASS_CALLS = 5  # a class's median from fewer calls is not compared
MIN_CALLS = 20  # candidate calls compared before latency is judged at all
Q = 0.5


@dataclass(frozen=True)
class Latency:
    """The candidate's typical call against the stable's at the same sizes."""

    calls: int  # the candidate's calls compared
    ratio: float  # their time over the stable's at the same sizes (geometric mean)
    excess_s: float  # their time less the stable's (mean)
    noise: float  # the stable's worst bucket over its whole window, by the same measure (>= 1)
    candidate_s: float  # the candidate's median call, weighted over its classes
    stable_s: float  # the stable's at the same sizes

    def describe(self) -> str:
        return (f"candidate's median call {self.candidate_s * 1000:.1f} ms against stable's "
                f"{self.stable_s * 1000:.1f} ms at the same batch sizes ({self.ratio:.2f}x over "
                f"{self.calls} calls; the stable's own noise {self.noise:.2f}x)")


class Reference:
    """The stable's median call time by size class, and its t(B) where a class is missing."""

    def __init__(self, stable: CallTimes) -> None:
        self.medians = {k: quantile(b, Q) for k, b in stable.bins.items()
                        if sum(b.values()) >= MIN_CLASS_CALLS}
        self.line = _fit([(stable.mean_rows(k), m, stable.count(k))
                          for k, m in self.medians.items()])

    def at(self, klass: int, rows: float) -> float:
        """The stable's typical call of that class (0: nothing to compare with)."""
        known = self.medians.get(klass)
        if known is not None:
            return known
        if self.line is None:
            return 0.0
        fixed_s, per_row_s = self.line
        return max(0.0, fixed_s + per_row_s * rows)


def compare(stable: CallTimes, candidate: CallTimes, stable_buckets: tuple[CallTimes, ...]
            ) -> Latency | None:
    """The candidate's calls against the stable's (None: too few to judge)."""
    reference = Reference(stable)
    pairs = _pairs(candidate, reference)
    calls = sum(pair.calls for pair in pairs)
    if calls < MIN_CALLS:
        return None
    noise = max([1.0, *(_ratio([p for p in _pairs(bucket, reference)
                                 if p.klass in reference.medians])
                        for bucket in stable_buckets)])
    mine = sum(p.calls * p.median_s for p in pairs) / calls
    theirs = sum(p.calls * p.reference_s for p in pairs) / calls
    return Latency(calls, _ratio(pairs), mine - theirs, noise, mine, theirs)


@dataclass(frozen=True)
class _Pair:
    klass: int
    calls: int
    median_s: float
    reference_s: float


def _pairs(calls: CallTimes, reference: Reference) -> list[_Pair]:
    """Each class with enough calls, its median against the reference's."""
    pairs = []
    for klass, histogram in calls.bins.items():
        count = sum(histogram.values())
        expected = reference.at(klass, calls.mean_rows(klass))
        if count >= MIN_CLASS_CALLS and expected > 0:
            pairs.append(_Pair(klass, count, quantile(histogram, Q), expected))
    return pairs


def _ratio(pairs: list[_Pair]) -> float:
    """The calls' time over the reference's, a geometric mean weighted by calls (1: none)."""
    total = sum(p.calls for p in pairs)
    if not total:
        return 1.0
    return math.exp(sum(p.calls * math.log(p.median_s / p.reference_s) for p in pairs) / total)


def _fit(points: list[tuple[float, float, int]]) -> tuple[float, float] | None:
    """A weighted least-squares line (fixed, per row) through (rows, seconds, weight); one
    point gives a flat line; a negative slope is taken as flat (noise, not a model)."""
    if not points:
        return None
    total = sum(w for _, _, w in points)
    mean_x = sum(w * x for x, _, w in points) / total
    mean_y = sum(w * y for _, y, w in points) / total
    spread = sum(w * (x - mean_x) ** 2 for x, _, w in points)
    if spread <= 0:
        return mean_y, 0.0
    slope = max(0.0, sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points) / spread)
    return mean_y - slope * mean_x, slope


def latency_json(stable: Figures, candidate: Figures) -> dict[str, float | int | None]:
    """The comparison as the guard's look and decisions show it (nulls: too few calls)."""
    found = compare(stable.calls, candidate.calls, stable.buckets)
    if found is None:
        return {"calls": candidate.calls.calls, "ratio": None, "noise": None,
                "candidate_median_ms": None, "stable_median_ms": None}
    return {"calls": found.calls, "ratio": round(found.ratio, 3),
            "noise": round(found.noise, 3),
            "candidate_median_ms": round(found.candidate_s * 1000, 2),
            "stable_median_ms": round(found.stable_s * 1000, 2)}
