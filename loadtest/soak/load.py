"""Open-loop load over every gateway, and the short closed-loop run that measures capacity.

Arrivals are drawn in advance from the seed (Poisson, as ``loadtest.generator`` draws them), and
each request is sent at its time whatever the stack is doing, so a stack in trouble cannot slow
the client down and hide its own queueing. Every request has its own input and Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

from loadtest.generator import schedule
from loadtest.soak.client import Client
from loadtest.soak.clock import Clock
from loadtest.soak.ledger import Tracked, payload

MAX_REQUESTS = 500_000
MAX_INFLIGHT = 5_000  # requests the client follows at once; past it an arrival is skipped
SUBMIT_BUDGET_S = 30.0  # a submission's retries stop this long after its scheduled time


@dataclass
class Load:
    client: Client
    clock: Clock
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))
    tasks: list[Tracked] = field(default_factory=list)
    skipped: int = 0  # arrivals not sent: MAX_INFLIGHT requests were being followed

    async def run(self, rate: float, duration_s: float, drain_s: float, seed: int) -> None:
        """Send at ``rate`` for ``duration_s`` (from the clock's start), then follow what was
        accepted for at most ``drain_s`` more."""
        count = min(MAX_REQUESTS, max(1, int(rate * duration_s)))
        times = [t for t in schedule(rate, count, seed=seed) if t < duration_s]
        deadline = duration_s + drain_s
        running: set[asyncio.Task[None]] = set()
        for index, at in enumerate(times):
            await self.clock.sleep_until(at)
            if len(running) >= MAX_INFLIGHT:
                self.skipped += 1
                continue
            task = Tracked(index, f"soak-{self.nonce}-{index}", payload(self.nonce, index), at)
            self.tasks.append(task)
            sent = asyncio.create_task(self._one(task, deadline))
            running.add(sent)
            sent.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    async def _one(self, task: Tracked, deadline_s: float) -> None:
        await self.client.submit(task, min(deadline_s, task.scheduled_s + SUBMIT_BUDGET_S))
        if task.task_id is not None and task.first_final is None:
            await self.client.follow(task, deadline_s)


CALIBRATION_WARMUP_S = 1.0  # answers in the first second are not counted


async def calibrate(client: Client, clock: Clock, seconds: float, workers: int = 48) -> float:
    """Tasks per second the stack finishes with ``workers`` clients that each send the next
    request when the last one is answered (closed loop: the most the stack can do), counted
    over ``seconds`` after a warm-up."""
    nonce = secrets.token_hex(4)
    done: list[float] = []
    count_from = clock.now() + CALIBRATION_WARMUP_S
    stop_at = count_from + seconds

    async def worker(number: int) -> None:
        index = number
        while clock.now() < stop_at:
            task = Tracked(index, f"calibrate-{nonce}-{index}", payload(nonce, index),
                           clock.now())
            await client.submit(task, stop_at)
            if task.task_id is not None and task.first_final is None:
                await client.follow(task, stop_at + 10)
            if task.first_final is not None and count_from <= clock.now() <= stop_at:
                done.append(clock.now())
            index += workers

    await asyncio.gather(*(worker(n) for n in range(workers)))
    return len(done) / seconds
