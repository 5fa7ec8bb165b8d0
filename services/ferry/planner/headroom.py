"""What "sized for +20%" promises: the p99 at the design load holds against the simulation's own
noise, not on one lucky run.

One run's p99 depends on its arrivals: near saturation a run may settle into queues that another
run, as long, never builds (in the design scenario 38 instances gave 376, 377 and 497 ms on three
runs of 20 s at 12,000/s). So the answer is run at the design load on several arrivals (seeds),
and the p99 it promises is an upper prediction bound over their p99s: the p99 one more run would
stay under 19 times in 20, mean + t · sd · √(1 + 1/n) with Student's t for n - 1 degrees of
freedom (one-sided, 95%). Runs that agree give a bound near their worst; runs that disagree, as
near saturation, give one far above it, and the answer grows until they agree under the target.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ferry.errors import ConfigError

# Student's t, one-sided 95%, by degrees of freedom (runs - 1)
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833}
MAX_RUNS = max(T95) + 1


def check_runs(runs: int) -> None:
    """Refused unless the bound can be drawn from ``runs`` runs."""
    if not 2 <= runs <= MAX_RUNS:
        raise ConfigError(f"the headroom needs 2 to {MAX_RUNS} runs at the design load, not {runs}")


def p99_bound(p99s: Sequence[float]) -> float:
    """The p99 one more run would stay under 19 times in 20, from these runs' p99s (two at
    least)."""
    check_runs(len(p99s))
    n = len(p99s)
    return statistics.fmean(p99s) + T95[n - 1] * statistics.stdev(p99s) * math.sqrt(1 + 1 / n)


def largest_next(p99s: Sequence[float], runs: int, target_s: float) -> float | None:
    """The largest p99 the next of ``runs`` runs may have (after ``p99s``) with the bound still
    able to meet ``target_s``, the runs after it taken at the mean (the most they can help);
    None if no p99 of it can. A run may stop once its p99 is past this: the verdict is known."""
    check_runs(runs)
    if not p99s:
        return target_s  # all at one p99: the bound is that p99

    def bound(p99: float) -> float:
        taken = [*p99s, p99]
        return p99_bound(taken + [statistics.fmean(taken)] * (runs - len(taken)))

    low = statistics.fmean(p99s)  # from here up, the bound rises with the next p99
    if bound(low) > target_s:
        return None
    high = target_s
    if bound(high) <= target_s:
        return high
    for _ in range(40):  # bisection to well under a microsecond
        middle = (low + high) / 2
        low, high = (middle, high) if bound(middle) <= target_s else (low, middle)
    return low
