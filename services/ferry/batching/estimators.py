"""What the adaptive flush needs to know, estimated from what the batcher sees (pure, clock-free).

``ArrivalRate``: requests per second, an exponentially decaying count (it falls when nobody comes).
``BatchCost``: a model's call time t(B) = fixed + per_item · B, fitted by exponentially weighted
least squares over recent calls; the fixed part is what waiting for one more passenger can save.
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


@dataclass
class BatchCost:
    """t(B) = fixed + per_item · B, weighted toward the last ``1 / weight`` calls."""

    weight: float = 0.05
    _n: float = 0.0
    _b: float = 0.0
    _t: float = 0.0
    _bb: float = 0.0
    _bt: float = 0.0

    def add(self, batch: int, seconds: float) -> None:
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
