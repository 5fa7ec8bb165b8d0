"""Starts an exited service again after a short pause, as Kubernetes restarts a container."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from loadtest.soak.clock import Clock, wait_for_event
from loadtest.soak.stack import Service

log = logging.getLogger("loadtest.soak")


@dataclass(frozen=True)
class Restart:
    at_s: float
    name: str
    exit_code: int | None


class Supervisor:
    def __init__(self, services: list[Service], clock: Clock, *, pause_s: float = 1.0,
                 max_restarts: int = 200, interval_s: float = 0.25) -> None:
        self.services = services
        self.clock = clock
        self.pause_s = pause_s
        self.max_restarts = max_restarts  # per service: a crash loop is not restarted forever
        self.interval_s = interval_s
        self.restarts: list[Restart] = []
        self._restarting: set[str] = set()
        self._pending: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop`` is set; then let restarts under way finish."""
        while not await wait_for_event(stop, self.interval_s):
            for service in self.services:
                if self._exited(service):
                    self._restarting.add(service.name)
                    task = asyncio.create_task(self._restart(service))
                    self._pending.add(task)
                    task.add_done_callback(self._pending.discard)
        if self._pending:
            await asyncio.gather(*self._pending)

    def _exited(self, service: Service) -> bool:
        return (not service.held and service.name not in self._restarting
                and not service.process.running() and service.restarts < self.max_restarts)

    async def _restart(self, service: Service) -> None:
        try:
            code = service.process.returncode()
            await asyncio.to_thread(service.process.stop, 1.0)  # reaps it, closes its log
            await asyncio.sleep(self.pause_s)
            service.process.start()
            service.restarts += 1
            self.restarts.append(Restart(round(self.clock.now(), 2), service.name, code))
            log.info("[%7.2fs] restarted %s (it exited with %s)", self.clock.now(),
                     service.name, code)
        finally:
            self._restarting.discard(service.name)
