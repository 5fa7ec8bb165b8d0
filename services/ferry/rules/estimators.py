"""What the adaptive flush needs to know, estimated from what the batcher sees (pure, clock-free).

``ArrivalRate``: requests per second, an exponentially decaying count (it falls when nobody comes).
``BatchCost``: a model's call time t(B) = fixed + per_item · B, fitted by exponentially weighted
least squares over recent calls; the fixed part is what waiting for one more passenger can save.
It also tracks how late calls run past the fit (their 90th percentile, by stochastic
approximation), the margin a batch held for its deadline leaves.
``Window``: how many batches of a model may be at Triton at once, at most its instances. Halved
when a call takes far longer than the fitted t(B) (Triton is queueing it: other clients share it,
or its instances are saturated), grown back by one per window of calls on time (AIMD). A smaller
window means the batcher reads less, and work waits in Redis rather than stacked at Triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class ArrivalRate:
    """Arrivals per second with time constant ``tau_s``; updated and read at caller-given times."""

    tau_s: float = 0.5
    _rate: float = 0.0
    _at: float | None = None

    def add(self, now: float, count: int = 1) -> None:
        self._rate = self.at(now) + count / self.tau_s
        self._at = now

    def at(self, now: float) -> float:
        """The rate as of ``now`` (decayed since the last arrival)."""
        if self._at is None:
            return 0.0
        return self._rate * math.exp(-max(0.0, now - self._at) / self.tau_s)


LATE_STEP_S = 0.0002  # the late_s tracker's step: up 9 steps on a call past it, down 1 otherwise


@dataclass
class BatchCost:
    """t(B) = fixed + per_item · B, weighted toward the last ``1 / weight`` calls."""

    weight: float = 0.05
    late_s: float = 0.0  # 90% of calls end within this of the fit (once settled)
    _n: float = 0.0
    _b: float = 0.0
    _t: float = 0.0
    _bb: float = 0.0
    _bt: float = 0.0

    def add(self, batch: int, seconds: float) -> None:
        if self.settled:  # how far calls run past the fit: its 90th percentile, tracked
            late = seconds - self.time_at(batch) > self.late_s
            self.late_s = max(0.0, self.late_s + LATE_STEP_S * (9.0 if late else -1.0))
        keep = 1.0 - self.weight if self._n else 0.0
        self._n = self._n * keep + 1.0
        self._b = self._b * keep + batch
        self._t = self._t * keep + seconds
        self._bb = self._bb * keep + batch * batch
        self._bt = self._bt * keep + batch * seconds

    @property
    def known(self) -> bool:
        return self._n > 0

    @property
    def settled(self) -> bool:
        """Enough calls seen (about ten) to judge a call slow against the fit."""
        return self._n >= 10

    @property
    def mean_s(self) -> float:
        return self._t / self._n if self._n else 0.0

    @property
    def per_item_s(self) -> float:
        """The slope; 0 until batch sizes have varied enough to tell it from the fixed part."""
        if not self._n:
            return 0.0
        mean_b = self._b / self._n
        variance = self._bb / self._n - mean_b * mean_b
        if variance < 0.25:
            return 0.0
        covariance = self._bt / self._n - mean_b * self.mean_s
        return max(0.0, covariance / variance)

    @property
    def fixed_s(self) -> float:
        """The intercept, within [0, mean]: all of the mean while the slope is unknown."""
        if not self._n:
            return 0.0
        intercept = self.mean_s - self.per_item_s * self._b / self._n
        return min(max(0.0, intercept), self.mean_s)

    @property
    def mean_batch(self) -> float:
        return self._b / self._n if self._n else 0.0

    def time_at(self, batch: int) -> float:
        """t(batch) from the fit; 0 while nothing is known."""
        return self.fixed_s + self.per_item_s * batch if self._n else 0.0


def service_rate(cost: BatchCost, slots: int, batch: int) -> float:
    """Tasks per second a model serves with ``slots`` batches of ``batch`` at once.

    With the slope known, at full batches: slots · B / t(B). While every call had the same size
    the slope is unknown and the rate is what that size gives (an underestimate at light load,
    exact under overload, when every batch is full). 0 while nothing is known.
    """
    if not cost.known:
        return 0.0
    if cost.per_item_s > 0:
        seconds = cost.time_at(batch)
        return slots * batch / seconds if seconds > 0 else 0.0
    return slots * cost.mean_batch / cost.mean_s if cost.mean_s > 0 else 0.0


@dataclass
class Window:
    """Batches allowed at Triton at once: between 1 and ``limit``, AIMD on call slowness."""

    limit: int
    slow_factor: float = 2.0  # a call this many times its fitted time is 'slow'
    slack_s: float = 0.005  # ... and at least this much longer (timer noise on tiny calls)
    size: float = 0.0

    def __post_init__(self) -> None:
        self.size = self.size or float(self.limit)

    @property
    def allowed(self) -> int:
        return max(1, min(self.limit, math.floor(self.size)))

    def resize(self, limit: int) -> None:
        """The model's instance count changed: a window that was open all the way stays so."""
        was_full = self.size >= self.limit
        self.limit = max(1, limit)
        self.size = float(self.limit) if was_full else min(self.size, float(self.limit))

    def observe(self, seconds: float, expected_s: float) -> None:
        """A call took ``seconds`` where the fit expected ``expected_s`` (0: no fit yet)."""
        if expected_s <= 0:
            return
        if seconds > self.slow_factor * expected_s and seconds - expected_s > self.slack_s:
            self.overloaded()
        else:
            self.size = min(float(self.limit), self.size + 1.0 / max(1.0, self.size))

    def overloaded(self) -> None:
        """Triton is queueing or refusing work: halve."""
        self.size = max(1.0, self.size / 2.0)
