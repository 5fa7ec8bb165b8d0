"""What the jobs engine needs of the rest of Ferry: its items made into tasks and admitted
through the one way in, their ends watched, their cancels, and how busy a model is with
interactive work. The gateway provides it (``gateway.bulk.parts``); the engine knows no more."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from ferry.submission import Submission
from ferry.tasks.base import Admitted, Cancellation, Owner
from ferry.tasks.envelope import Envelope
from ferry.tasks.waiters import Watch


@dataclass(frozen=True)
class Load:
    """A model's interactive work queued, and what it can serve (its measured rate, tasks/s,
    and one batch's time; 0 while unmeasured)."""

    interactive: int
    rate: float
    batch_s: float


class Tasks(Protocol):
    """The engine's port to the task system."""

    async def prepare(self, submission: Submission) -> Envelope:
        """An item's submission checked against its model, as its task's envelope (a
        ``ClientError`` saying why it cannot be one)."""
        ...

    async def admit(self, envelope: Envelope, owner: Owner) -> Admitted:
        """Admit the task (``TooManyRequestsError`` for a full backlog: asked again later)."""
        ...

    def watch(self, task_id: str) -> AbstractContextManager[Watch]:
        """Wait for the task's end, from now until the block ends."""
        ...

    async def cancel(self, task_id: str, client_id: str) -> Cancellation:
        """End the task CANCELLED if it has not reached Triton."""
        ...

    async def load(self, model: str) -> Load:
        """How busy ``model`` is with interactive work."""
        ...
