"""Where the CPU of a running process goes: py-spy samples, summed by function (self time)."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_SITE = re.compile(r" \((?:/[^()]*?/)?(?:site-packages|lib/python3\.\d+)/")


@dataclass(frozen=True)
class Hotspot:
    function: str
    share: float  # of the process's samples


def py_spy() -> str | None:
    """The py-spy binary, if installed (it is in the dev dependencies)."""
    return shutil.which("py-spy") or next(
        (str(p) for p in [Path(__file__).parents[2] / ".venv" / "bin" / "py-spy"] if p.exists()),
        None)


async def record(pid: int, seconds: float, out: Path) -> bool:
    """Sample ``pid`` for ``seconds`` (only while it holds the GIL: CPU, not waiting)."""
    binary = py_spy()
    if binary is None:
        return False
    proc = await asyncio.create_subprocess_exec(
        binary, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "--gil",
        "-f", "raw", "-o", str(out), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    return await proc.wait() == 0 and out.exists()


def hotspots(raw: Path, top: int = 12) -> list[Hotspot]:
    """The functions with the most samples of their own (collapsed-stack input)."""
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        own[_SITE.sub(" (", stack.split(";")[-1])] += int(count)
    return [Hotspot(name, n / total) for name, n in own.most_common(top)] if total else []
