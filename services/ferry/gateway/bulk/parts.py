"""Bulk jobs' parts in a gateway: their store, blob store, runner and routes' work, and the
port the jobs engine admits its items through (``jobs.port``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

from ferry.errors import ConfigError
from ferry.gateway.assembly import GatewayRoom
from ferry.gateway.bulk.routes import JobsApi
from ferry.jobs.blobs import S3Keys, blob_store
from ferry.jobs.items import ItemMaker
from ferry.jobs.manifest import Sources
from ferry.jobs.port import Load, Tasks
from ferry.jobs.run import RunSettings
from ferry.jobs.runner import JobRunner
from ferry.jobs.store import JobStore
from ferry.settings import GatewaySettings
from ferry.submission import Submission
from ferry.tasks.base import Admitted, Cancellation, Owner
from ferry.tasks.envelope import Envelope
from ferry.tasks.waiters import Watch


@dataclass(frozen=True)
class JobParts:
    api: JobsApi
    runner: JobRunner


class GatewayTasks(Tasks):
    """The jobs engine's port (``jobs.port.Tasks``), as this gateway provides it: the room's
    preparation and admission, its waiters, its store and its capacity board. An adapter: each
    method is the port's, done by the part that does it."""

    def __init__(self, room: GatewayRoom) -> None:
        self.preparer = room.preparer
        self.admitter = room.shadows
        self.waiters = room.parts.waiters
        self.store = room.parts.store
        self.capacity = room.parts.capacity

    async def prepare(self, submission: Submission) -> Envelope:
        return (await self.preparer.prepare(submission)).envelope

    async def admit(self, envelope: Envelope, owner: Owner) -> Admitted:
        return await self.admitter(envelope, owner)

    def watch(self, task_id: str) -> AbstractContextManager[Watch]:
        return self.waiters.watch(task_id)

    async def cancel(self, task_id: str, client_id: str) -> Cancellation:
        return await self.store.cancel(task_id, client_id)

    async def load(self, model: str) -> Load:
        backlog = await self.store.backlog(model)
        capacity = await self.capacity.of(model)
        return Load(sum(n for priority, n in backlog.items() if priority.interactive),
                    capacity.rate, capacity.batch_s)


def job_parts(room: GatewayRoom, settings: GatewaySettings) -> JobParts:
    try:
        sources = Sources.parse(settings.job_sources)
    except ValueError as exc:
        raise ConfigError(f"job_sources: {exc}") from None
    store = JobStore(room.parts.hot, record_ttl_s=settings.job_record_ttl_s)
    keys = (S3Keys(settings.s3_access_key_id, settings.s3_secret_access_key)
            if settings.s3_access_key_id else None)
    blobs = blob_store(settings.job_store_url or settings.job_store_dir, settings.s3_endpoint,
                       keys)
    items = ItemMaker(sources, settings.max_body_bytes, settings.s3_endpoint, keys)
    runner = JobRunner(GatewayTasks(room), store, blobs, items, RunSettings(
        window=settings.job_window, lease_ms=max(1, round(settings.job_lease_s * 1000))))
    return JobParts(JobsApi(room.catalog, store, blobs, sources, settings), runner)
