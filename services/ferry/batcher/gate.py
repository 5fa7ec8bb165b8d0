"""Whether Triton can be reached: while it cannot, batchers wait instead of failing their work."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ferry.triton.base import InferenceBackend

log = logging.getLogger(__name__)


class BackendGate:
    """Open while Triton answers; closed during an outage, while one task probes for its return."""

    def __init__(self, backend: InferenceBackend, *, probe_min_s: float = 0.2,
                 probe_max_s: float = 2.0) -> None:
        self.backend = backend
        self.probe_min_s = probe_min_s
        self.probe_max_s = probe_max_s
        self._open = asyncio.Event()
        self._open.set()
        self._prober: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def close_for_outage(self, reason: str) -> None:
        """Triton is unreachable: hold reading and dispatch until a probe sees it ready."""
        if self._open.is_set():
            log.warning("Triton unreachable (%s); holding work until it is ready again", reason)
            self._open.clear()
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe(), name="ferry-triton-probe")

    async def wait_open(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for Triton to be ready; whether it is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), max(0.0, timeout_s))
        return self._open.is_set()

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober

    async def _probe(self) -> None:
        delay = self.probe_min_s
        while not await self.backend.server_ready():
            await asyncio.sleep(delay)
            delay = min(self.probe_max_s, delay * 2)
        log.info("Triton is ready again")
        self._open.set()
