"""Shadow traffic, a layer above the admission port: a share of the requests a rollout's stable
version answers is copied to its candidate (``tasks.envelope.shadow_of``), admitted after the
request's own task, in the background, at batch priority; a copy the model's backlog refuses is
dropped, never queued behind. Each pair is kept for the keeper's comparison.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Literal

from ferry.errors import DependencyUnavailableError, ServiceUnavailableError, TooManyRequestsError
from ferry.gateway.versions import Versions
from ferry.rollouts.store import Pair, RolloutStore
from ferry.tasks.admission import Admit
from ferry.tasks.base import NO_OWNER, Admitted, Owner
from ferry.tasks.envelope import Envelope, shadow_of
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)
Outcome = Literal["sent", "dropped"]
STOP_WAIT_S = 1.0  # copies being admitted when the gateway stops get this long, then are dropped


def _uncounted(model: str, outcome: Outcome) -> None:
    """Nothing counts."""


class Shadowing:
    """Admits through ``admit``, then sends the task's shadow copy when its rollout asks."""

    def __init__(self, admit: Admit, versions: Versions, store: RolloutStore,
                 counted: Callable[[str, Outcome], None] = _uncounted) -> None:
        self.admit = admit
        self.versions = versions
        self.store = store
        self.counted = counted
        self._copies: set[asyncio.Task[None]] = set()

    async def __call__(self, envelope: Envelope, owner: Owner = NO_OWNER) -> Admitted:
        admitted = await self.admit(envelope, owner)
        task = envelope.task
        rollout = self.versions.cached(task.model)
        if (rollout is not None and rollout.shadowed_version(task.model_version, random.random())
                and not task.shadow_of and not task.review_of):
            copy = asyncio.create_task(self._send(task, rollout.candidate),
                                       name=f"ferry-shadow-{task.task_id}")
            self._copies.add(copy)
            copy.add_done_callback(self._copies.discard)
        return admitted

    async def _send(self, task: Task, candidate: str) -> None:
        """Admit the copy for ``candidate`` and keep the pair, or count it dropped."""
        shadow = shadow_of(task, candidate)
        try:
            await self.admit(shadow)
            await self.store.add_pair(task.model, Pair(task.task_id, shadow.task.task_id,
                                                       candidate), time.time())
        except (TooManyRequestsError, ServiceUnavailableError):
            self.counted(task.model, "dropped")
            return
        except DependencyUnavailableError as exc:
            log.warning("shadow of task %s not admitted: %s", task.task_id, exc)
            self.counted(task.model, "dropped")
            return
        self.counted(task.model, "sent")

    async def stop(self) -> None:
        """Copies being admitted: a moment to finish, then they are dropped."""
        if self._copies:
            await asyncio.wait(self._copies, timeout=STOP_WAIT_S)
            for copy in self._copies:
                copy.cancel()
