"""Per-model circuit breaker: a pure state machine over a caller's clock.

``CircuitBreaker``: closed while calls mostly succeed; when the share of failed calls over the
last ``window_s`` passes ``threshold`` (with at least ``min_calls`` calls), it opens and refuses
calls for ``cooldown_s``; then it half-opens and lets one probe call through, closing on its
success and opening again on its failure. Outages (Triton unreachable) are not calls: the caller
does not record them, so waiting out a restart never trips the breaker.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    @property
    def gauge(self) -> int:
        """The metric's value: 0 closed, 1 half-open, 2 open."""
        return {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}[self]


@dataclass
class CircuitBreaker:
    threshold: float = 0.5
    window_s: float = 10.0
    min_calls: int = 20
    cooldown_s: float = 30.0
    _calls: deque[tuple[float, bool]] = field(default_factory=deque)
    _failures: int = 0
    _opened_at: float | None = None
    _probing: bool = False

    def state(self, now: float) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if now - self._opened_at < self.cooldown_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def retry_after(self, now: float) -> float:
        """Seconds until the breaker lets a probe through (0 unless open)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self._opened_at + self.cooldown_s - now)

    def allow(self, now: float) -> bool:
        """Whether a call may go now; half-open, only one probe at a time."""
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN or self._probing:
            return False
        self._probing = True
        return True

    def abandon(self) -> None:
        """A call ``allow`` let through ended without telling success from failure (an outage,
        a split): if it was the probe, the next call probes."""
        self._probing = False

    def record(self, now: float, ok: bool) -> None:
        """The outcome of a call that ``allow`` let through."""
        if self._opened_at is not None:  # the probe's answer
            self._probing = False
            if ok:
                self._opened_at = None
                self._calls.clear()
                self._failures = 0
            else:
                self._opened_at = now
            return
        self._calls.append((now, ok))
        self._failures += not ok
        self._forget(now)
        calls = len(self._calls)
        if calls >= self.min_calls and self._failures / calls >= self.threshold:
            self._opened_at = now

    def error_rate(self, now: float) -> float:
        self._forget(now)
        return self._failures / len(self._calls) if self._calls else 0.0

    def _forget(self, now: float) -> None:
        while self._calls and self._calls[0][0] <= now - self.window_s:
            _, ok = self._calls.popleft()
            self._failures -= not ok
