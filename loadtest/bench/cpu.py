"""CPU time of processes and their children, from /proc (user + system, every thread).

Linux scales a process's tick-sampled user and system times so that they add up to the
scheduler's exact runtime; their sum is what is reported here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields after "pid (comm)"


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads); 0 once it is gone."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS if fields else 0.0


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat: all but
    idle and iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def family(pid: int) -> list[int]:
    """``pid`` and all its descendants (a gateway's workers, Triton's backend stubs)."""
    members, frontier = [pid], [pid]
    while frontier:
        kids = [c for p in frontier for c in children(p)]
        members += kids
        frontier = kids
    return members


@dataclass
class CpuMeter:
    """CPU seconds of named process groups between ``start`` and ``stop``."""

    groups: Mapping[str, Iterable[int]]

    def snapshot(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) for p in pids) for name, pids in self.groups.items()}

    @staticmethod
    def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
        return {name: max(0.0, after[name] - before.get(name, 0.0)) for name in after}
