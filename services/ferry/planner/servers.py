"""A process of the simulated deployment (``ferry.planner.simulate``): a gateway worker, a
batcher, a Redis server, each doing one piece of work at a time, as a Python event loop or
Redis does."""

from __future__ import annotations

import bisect


class Server:
    """A process that does one piece of work at a time. Work is booked when the simulation
    knows of it, which may be ahead of when it can start (a task's later steps are booked when
    it arrives); each piece takes the first idle stretch at or after its start that holds it, so
    work booked early never holds up work that is ready sooner."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.busy_s = 0.0

    def run(self, at: float, seconds: float) -> float:
        """Work of ``seconds`` that may start at ``at``: when it is done."""
        self.busy_s += seconds
        starts, ends = self.starts, self.ends
        if not ends or at >= ends[-1]:  # after all that is booked: the cheapest case
            end = at + seconds
            if ends and ends[-1] == at:
                ends[-1] = end
                return end
            starts.append(at)
            ends.append(end)
            return end
        return self._book(bisect.bisect_right(ends, at), at, seconds)

    def forget(self, now: float) -> None:
        """Drop the stretches that ended before ``now``: nothing is booked before the clock,
        so they can no longer hold up any work (and the search for a gap stays short)."""
        done = bisect.bisect_left(self.ends, now)
        if done:
            del self.starts[:done], self.ends[:done]

    def _book(self, index: int, start: float, seconds: float) -> float:
        """Book ``seconds`` in the first gap from stretch ``index`` on that holds them, joined
        to the stretches it touches (so that a saturated server is one long stretch, not
        thousands); when it ends. (Stretches never touch, so each skipped one ends after the
        work's start so far.)"""
        starts, ends = self.starts, self.ends
        count = len(starts)
        joins_previous = index > 0 and ends[index - 1] >= start
        while index < count and starts[index] < start + seconds:
            start = ends[index]
            index += 1
            joins_previous = True
        end = start + seconds
        if index < count and starts[index] <= end:  # touches the next
            if joins_previous:
                ends[index - 1] = ends[index]
                del starts[index], ends[index]
            else:
                starts[index] = start
        elif joins_previous:
            ends[index - 1] = end
        else:
            starts.insert(index, start)
            ends.insert(index, end)
        return end
