"""When the client tries a call again, and how long it waits first: pure, over a clock and a
random source passed in, so that tests need no server and no sleep.

What is retried: a connection that failed or broke, and the answers 429 and 503 (a limit, or a
part of Ferry away for a moment), never another 4xx. A submission is safe to repeat because
every attempt carries the same ``Idempotency-Key``; a GET or a cancel is safe anyway.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

RETRIED_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How hard the client tries one call: at most ``attempts`` tries within ``deadline_s``
    of the first; between two, an exponential backoff with full jitter (a random wait in
    [0, min(``max_delay_s``, ``base_delay_s`` * 2^n)]), but never less than the answer's
    ``Retry-After``. A wait that would end past the deadline is not waited: the last error is
    raised at once."""

    attempts: int = 10
    deadline_s: float = 60.0
    base_delay_s: float = 0.1
    max_delay_s: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.deadline_s < 0 or self.base_delay_s < 0 \
                or self.max_delay_s < self.base_delay_s:
            raise ValueError(f"a retry policy needs attempts >= 1 and 0 <= base_delay_s <= "
                             f"max_delay_s, and deadline_s >= 0: {self}")

    def delay(self, retry: int, retry_after: float | None, draw: Callable[[], float]) -> float:
        """The wait before retry number ``retry`` (0 the first), ``draw`` a uniform [0, 1)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2.0 ** min(retry, 62))
        jittered = ceiling * draw()
        if retry_after is None:
            return jittered
        # The server's estimate is a floor; a little jitter above it spreads the clients it
        # refused at once, so they do not all come back in the same instant.
        return retry_after + jittered * 0.1


NEVER = RetryPolicy(attempts=1, deadline_s=0)


@dataclass
class Attempts:
    """One call's tries under a policy: ask ``next_delay`` after each failed try."""

    policy: RetryPolicy
    clock: Callable[[], float] = time.monotonic
    draw: Callable[[], float] = random.random
    made: int = 1
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    def next_delay(self, retry_after: float | None = None) -> float | None:
        """How long to wait before the next try; None: no more tries (attempts or deadline
        spent)."""
        if self.made >= self.policy.attempts:
            return None
        wait = self.policy.delay(self.made - 1, retry_after, self.draw)
        if self.clock() + wait - self.started > self.policy.deadline_s:
            return None
        self.made += 1
        return wait


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds (RFC 9110: delay-seconds or an HTTP-date); None when absent
    or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))  # Ferry sends whole seconds; a fraction is read too
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retried_status(status: int) -> bool:
    """Whether an answer with this HTTP status is worth trying again."""
    return status in RETRIED_STATUSES
