"""Seconds since the load started: every time in a soak's report is on this clock."""

from __future__ import annotations

import asyncio
import time


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def sleep_until(self, at_s: float) -> None:
        delay = at_s - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


async def wait_for_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s``."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True
