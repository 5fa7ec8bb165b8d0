"""How long a fault costs: from the fault until every request sent before it has ended and each
backlog is back to its level before the fault. Pure functions over a run's records, for the
recovery part (``loadtest.bench.recovery``) and the peers' kill -9 row (``loadtest.bench.versus``).

A backlog is a series of (seconds, level) samples: the requests a client has sent and not yet
had answered (``outstanding``), or the tasks in Ferry's streams (sampled from Redis). Its
*normal* level is the highest it reached in the ``PRE_S`` seconds before the fault; it is *back
to normal* at the first sample from which it stays at or under that level for ``HOLD_S``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

STEP_S = 0.1  # the client's backlog is read every STEP_S, as Ferry's queue depth is sampled
PRE_S = 3.0  # the window before the fault whose highest level is the normal one
HOLD_S = 1.0  # back to normal means staying there this long
AROUND_S = 1.0  # the requests "around the fault" are those sent from this long before it

Span = tuple[float, float | None]  # a request's send and its end (None: it never ended)
Series = Sequence[tuple[float, float]]  # (seconds, level), in time order


def outstanding(spans: Sequence[Span], step_s: float = STEP_S) -> list[tuple[float, float]]:
    """The requests sent and not yet ended, every ``step_s`` from 0 until ``HOLD_S`` after the
    last event (a request that never ended stays outstanding to the end)."""
    events = sorted([(start, 1) for start, _ in spans]
                    + [(end, -1) for _, end in spans if end is not None])
    if not events:
        return []
    last = events[-1][0] + HOLD_S
    series: list[tuple[float, float]] = []
    level, index = 0, 0
    for step in range(int(last / step_s) + 2):
        at = round(step * step_s, 6)
        while index < len(events) and events[index][0] <= at:
            level += events[index][1]
            index += 1
        series.append((at, float(level)))
    return series


def normal_level(series: Series, fault_at: float, pre_s: float = PRE_S) -> float | None:
    """The highest level in the ``pre_s`` before the fault (None: no sample there)."""
    before = [level for at, level in series if fault_at - pre_s <= at < fault_at]
    return max(before) if before else None


def back_to_normal(series: Series, normal: float, after: float,
                   hold_s: float = HOLD_S) -> float | None:
    """The first sample time at or after ``after`` from which the level stays at or under
    ``normal`` for ``hold_s`` (the samples must reach that far); None if it never does."""
    times = [at for at, _ in series]
    for index, (at, level) in enumerate(series):
        if at < after or level > normal or times[-1] < at + hold_s:
            continue
        window = (lv for t, lv in series[index:] if t <= at + hold_s)
        if all(lv <= normal for lv in window):
            return at
    return None


def ended_by(spans: Sequence[Span], before: float) -> float | None:
    """When the last request sent before ``before`` ended (None: one of them never did)."""
    ends = [end for start, end in spans if start < before]
    if any(end is None for end in ends):
        return None
    return max((e for e in ends if e is not None), default=before)


@dataclass
class Recovery:
    """Seconds from the fault until each condition held (None: not within the run)."""

    earlier_ended_s: float | None  # every request sent before the fault ended
    backlogs_s: dict[str, float | None] = field(default_factory=dict)  # each back to normal

    @property
    def total_s(self) -> float | None:
        """Until all of them held: the fault's recovery time."""
        found = [self.earlier_ended_s, *self.backlogs_s.values()]
        if any(s is None for s in found):
            return None
        return max((s for s in found if s is not None), default=0.0)


def recovery(spans: Sequence[Span], fault_at: float, backlogs: Mapping[str, Series]
             ) -> Recovery:
    """The recovery of a run faulted at ``fault_at``: the requests sent before it ended, then
    each backlog back to its normal level (searched from that moment on)."""
    ended = ended_by(spans, fault_at)
    found = Recovery(None if ended is None else round(max(0.0, ended - fault_at), 2))
    for name, series in backlogs.items():
        normal = normal_level(series, fault_at)
        at = None if normal is None or ended is None else back_to_normal(
            series, normal, max(fault_at, ended))
        found.backlogs_s[name] = None if at is None else round(at - fault_at, 2)
    return found


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (NaN for none)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass(frozen=True)
class Latency:
    """p50, p99 and max (ms) of some requests, and how many."""

    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, millis: Sequence[float]) -> Latency:
        if not millis:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(millis), round(percentile(millis, 50), 1),
                   round(percentile(millis, 99), 1), round(max(millis), 1))


def around(sent: Sequence[tuple[float, float | None]], fault_at: float,
           recovery_s: float | None) -> Latency:
    """The latency (send to answer) of the requests sent from ``AROUND_S`` before the fault
    until it had recovered (until the end, if it never did), as (sent, seconds or None)."""
    until = math.inf if recovery_s is None else fault_at + recovery_s
    return Latency.of([seconds * 1000 for at, seconds in sent
                       if fault_at - AROUND_S <= at <= until and seconds is not None])
