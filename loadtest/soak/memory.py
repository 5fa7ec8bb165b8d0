"""Memory of every process of the stack: RSS read from /proc every few seconds, and a trend.

A process that restarts is a new series (its pid changes): a fresh process grows while it warms
up, which is not a leak. The trend of a series is the least-squares slope of its RSS over the
samples taken after ``warmup_s`` of that series' life, in MiB per minute; a flat line is what a
process without a leak shows once warm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024


@dataclass(frozen=True)
class Sample:
    t_s: float  # from the start of the load
    label: str  # gateway-0, redis-6379, ...
    pid: int
    rss_mib: float


def rss_bytes(pid: int) -> int | None:
    """Resident set size of one process (VmRSS), None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def family_rss_bytes(pids: Iterable[int]) -> int | None:
    """RSS of a process and its children together (Triton and its Python backend's stubs)."""
    sizes = [size for size in map(rss_bytes, pids) if size is not None]
    return sum(sizes) if sizes else None


def sample(t_s: float, processes: dict[str, tuple[int, Callable[[], int | None]]]
           ) -> list[Sample]:
    """One sample per live process: label to (pid, how to read its RSS in bytes)."""
    found = []
    for label, (pid, read) in processes.items():
        size = read()
        if size is not None:
            found.append(Sample(round(t_s, 2), label, pid, round(size / MIB, 2)))
    return found


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute; None under 3 points
    or with no spread in time."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / spread
    return round(slope * 60, 3)


@dataclass(frozen=True)
class Trend:
    label: str
    pid: int
    samples: int  # after the warm-up
    first_mib: float
    last_mib: float
    mib_per_min: float | None


def trends(samples: Iterable[Sample], warmup_s: float) -> list[Trend]:
    """A trend per series (label and pid), from the samples past its warm-up."""
    series: dict[tuple[str, int], list[Sample]] = {}
    for item in samples:
        series.setdefault((item.label, item.pid), []).append(item)
    found = []
    for (label, pid), items in sorted(series.items()):
        born = items[0].t_s
        warm = [s for s in items if s.t_s - born >= warmup_s] or items[-1:]
        points = [(s.t_s, s.rss_mib) for s in warm]
        found.append(Trend(label, pid, len(warm), warm[0].rss_mib, warm[-1].rss_mib,
                           slope_per_minute(points)))
    return found
