"""Where ``ferry plan size`` stands while it works, on stderr (stdout keeps only the answer).

On a terminal: one line, rewritten in place as each simulated run starts and cleared at the end.
Elsewhere (a pipe, a file, a CI log): a line of its own each time the sizing moves on (a new best
in the search, the headroom's check of another instance count, the figures), and one when it is
done, so that a log shows it is alive without a line per run.
"""

from __future__ import annotations

import shutil
import sys
import time
from types import TracebackType
from typing import TextIO

from ferry.planner.deployment import Deployment
from ferry.planner.search import Progress


class ProgressLine:
    """Told each ``Progress`` of a sizing (``search.size``), shows it on ``stream``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty()
        self.started = time.monotonic()
        self.last: Progress | None = None

    def __call__(self, progress: Progress) -> None:
        text = progress_text(progress, time.monotonic() - self.started)
        if self.terminal:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line is not rewritten
            self.stream.write(f"\r\x1b[K{text[:width]}")
        elif self.last is None or _moved_on(self.last, progress):
            self.stream.write(f"{text}\n")
        self.last = progress
        self.stream.flush()

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.terminal:  # cleared on Ctrl-C too, for the message that follows
            self.stream.write("\r\x1b[K")
        elif error is None and self.last is not None:
            self.stream.write(f"done: {self.last.run} runs, "
                              f"{time.monotonic() - self.started:.0f} s\n")
        self.stream.flush()


def _moved_on(before: Progress, now: Progress) -> bool:
    """Another stage, or another deployment in it (a new best, another count checked)."""
    return now.stage != before.stage or _count(now.best) != _count(before.best)


def _count(best: Deployment | None) -> tuple[int, int, float, float] | None:
    return None if best is None else (best.instances, best.max_batch, best.max_wait_s,
                                      best.slo_s)


def progress_text(progress: Progress, elapsed_s: float) -> str:
    """``searching: 2 of ~7 runs, best so far 38 instances (64 / 10 ms), 2 s``: the stage, the
    run under way, about how many in all, and the deployment it is about (in the search, the
    best so far: its max batch and max wait)."""
    best = progress.best
    if best is None:
        about = "none meets the target yet"
    elif progress.stage == "checking":
        about = f"{best.instances} instances at the design load on other arrivals"
    elif progress.stage == "figures":
        about = f"{best.instances} instances and the envelope's at the target load"
    else:
        about = (f"best so far {best.instances} instances ({best.max_batch} / "
                 f"{ms(best.max_wait_s)}{', SLO' if best.slo_s else ''})")
    return (f"{progress.stage}: {progress.run} of ~{progress.expected} runs, {about}, "
            f"{elapsed_s:.0f} s")


def ms(seconds: float) -> str:
    """A duration as the planner prints it: ``50 ms``, ``1,687 ms``, ``1.5 ms``."""
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.0095 else f"{seconds * 1e3:.1f} ms"
