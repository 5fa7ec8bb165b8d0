"""The job runner of a gateway process: finds the jobs that need feeding, takes their leases,
and runs each (``jobs.run``) while it holds the lease.

Any number of gateway processes run one: a job is fed by one runner at a time (its lease, renewed
every third of its life), and taken over by another within a lease's life when its runner dies.
The items a client has in flight are bounded over all its jobs that a runner feeds (the window
is shared among them), so feeding is fair between clients and between a client's jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter

from ferry.errors import DependencyUnavailableError, RedisUnavailableError
from ferry.jobs.blobs import BlobStore
from ferry.jobs.items import ItemMaker
from ferry.jobs.pacing import feed_share, window_room
from ferry.jobs.port import Tasks
from ferry.jobs.run import Feeder, JobRun, LeaseLost, RunSettings
from ferry.jobs.store import JobStore

log = logging.getLogger(__name__)
FAILED_RUN_PAUSE_S = 5.0  # a run that failed unexpectedly is not retaken before this
PACE_EVERY_S = 0.5  # how often a model's interactive backlog is looked at


class JobRunner:
    """Runs the jobs it holds leases on; ``start`` and ``stop`` with the gateway."""

    def __init__(self, tasks: Tasks, store: JobStore, blobs: BlobStore, items: ItemMaker,
                 settings: RunSettings) -> None:
        self.tasks = tasks
        self.store = store
        self.settings = settings
        self.token = secrets.token_hex(8)
        self.feeder = Feeder(store, self.token, blobs, items, tasks, settings, self.room)
        self.runs: dict[str, tuple[JobRun, asyncio.Task[None]]] = {}
        self._paused: dict[str, float] = {}
        self._shares: dict[str, tuple[float, float]] = {}  # model: (looked at, feed share)
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.create_task(self._discover_loop())

    async def stop(self) -> None:
        """Stop feeding; leases are released, so another runner resumes the jobs at once."""
        tasks = [t for t in (self._loop, *(task for _, task in self.runs.values())) if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def room(self, run: JobRun) -> int:
        """How many more items ``run`` may have in flight: its share of its client's window,
        scaled down while interactive work queues for its model (``ferry.jobs.pacing``)."""
        clients = Counter(r.client for r, _ in self.runs.values())
        window = max(1, self.settings.window // max(1, clients[run.client]))
        share = await self._share(run.fields.get("model", ""))
        return window_room(window, share, run.queued)

    async def _share(self, model: str) -> float:
        """The feed share for ``model``, looked at once per ``PACE_EVERY_S``."""
        now = asyncio.get_running_loop().time()
        known = self._shares.get(model)
        if known is not None and now - known[0] < PACE_EVERY_S:
            return known[1]
        load = await self.tasks.load(model)
        share = feed_share(load.interactive, load.rate, load.batch_s)
        if share < 1.0 and (known is None or known[1] == 1.0):
            log.info("jobs of %s step back: %d interactive tasks queued (feed share %.2f)",
                     model, load.interactive, share)
        self._shares[model] = (now, share)
        return share

    async def _discover_loop(self) -> None:
        while True:
            try:
                await self._discover()
            except RedisUnavailableError as exc:
                log.warning("job runner: Redis unavailable (%s); looking again", exc)
            await asyncio.sleep(self.settings.discover_s)

    async def _discover(self) -> None:
        now = asyncio.get_running_loop().time()
        for job_id in await self.store.active():
            if len(self.runs) >= self.settings.max_jobs:
                return
            if job_id in self.runs or self._paused.get(job_id, 0.0) > now:
                continue
            if await self.store.lease(job_id, self.token, self.settings.lease_ms):
                run = JobRun(self.feeder, job_id)
                self.runs[job_id] = (run, asyncio.create_task(self._run(run)))
            elif not await self.store.fields(job_id):  # no record: an id left behind
                await self.store.retire(job_id)

    async def _run(self, run: JobRun) -> None:
        renewing = asyncio.create_task(self._renew(run))
        try:
            await run.run()
        except LeaseLost:
            log.warning("job %s: its lease went to another runner; stopped", run.job_id)
        except asyncio.CancelledError:
            raise
        except DependencyUnavailableError as exc:  # Redis (or Triton) down: resumed later
            log.warning("job %s: a dependency is unavailable (%s); resuming when it is back",
                        run.job_id, exc)
            self._paused[run.job_id] = asyncio.get_running_loop().time() + 1.0
        except Exception as exc:  # a bug, or a dependency down: noted, retried later
            log.exception("job %s: run failed; another attempt in %g s", run.job_id,
                          FAILED_RUN_PAUSE_S)
            self._paused[run.job_id] = asyncio.get_running_loop().time() + FAILED_RUN_PAUSE_S
            with contextlib.suppress(Exception):
                await self.store.note(run.job_id, f"its runner failed ({exc!r}); resuming")
        finally:
            renewing.cancel()
            self.runs.pop(run.job_id, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(run.job_id, self.token))

    async def _renew(self, run: JobRun) -> None:
        """Keep the lease; when it is lost, stop the run."""
        while True:
            await asyncio.sleep(self.settings.lease_ms / 3000)
            try:
                held = await self.store.lease(run.job_id, self.token, self.settings.lease_ms)
            except RedisUnavailableError:
                continue  # the lease may yet be renewed before it ends
            if not held:
                entry = self.runs.get(run.job_id)
                if entry is not None:
                    entry[1].cancel()
                return
