"""Whether Triton can be reached: while it cannot, batchers wait instead of failing their work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from ferry.triton.base import InferenceBackend

log = logging.getLogger(__name__)


class BackendGate:
    """Open while Triton answers; closed during an outage, while one task probes for its return.

    All work held during one outage shares one deadline: ``budget_s`` after the gate closed.
    The probe (Triton's ``ServerLive``, a cheap call) comes ``probe_min_s`` after the failure,
    then doubling to every ``probe_max_s``: batches resume at most half a second after Triton
    is back.
    """

    def __init__(self, backend: InferenceBackend, budget_s: float, *, probe_min_s: float = 0.2,
                 probe_max_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.budget_s = budget_s
        self.probe_min_s = probe_min_s
        self.probe_max_s = probe_max_s
        self.clock = clock
        self.closed_at: float | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._prober: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def deadline(self) -> float | None:
        """When work held in this outage gives up; None while the gate is open."""
        return None if self.closed_at is None else self.closed_at + self.budget_s

    def holding(self) -> bool:
        """Closed, and the outage is still within its budget: hold work rather than fail it."""
        deadline = self.deadline
        return deadline is not None and self.clock() < deadline

    def close_for_outage(self, reason: str) -> None:
        """Triton is unreachable: hold reading and dispatch until a probe sees it live."""
        if self._open.is_set():
            log.warning("Triton unreachable (%s); holding work for up to %g s", reason,
                        self.budget_s)
            self._open.clear()
            self.closed_at = self.clock()
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe(), name="ferry-triton-probe")

    async def wait_open(self) -> bool:
        """Wait until Triton is back or the outage's budget is spent; whether it is back."""
        deadline = self.deadline
        if deadline is None:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - self.clock())):
                await self._open.wait()
        return self._open.is_set()

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober

    async def _probe(self) -> None:
        delay = self.probe_min_s
        while not await self._live():
            await asyncio.sleep(delay)
            delay = min(self.probe_max_s, delay * 2)
        log.info("Triton answers again")
        self.closed_at = None
        self._open.set()

    async def _live(self) -> bool:
        try:
            return await self.backend.server_live()
        except Exception:  # a probe that dies would leave the gate shut for good
            log.exception("probing Triton failed")
            return False
