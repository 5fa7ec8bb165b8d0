"""Bulk jobs' parts in a gateway: their store, blob store, runner and routes' work, and the
port the jobs engine admits its items through (``jobs.port``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

from ferry.errors import ConfigError
from ferry.gateway.bulk.routes import JobsApi
from ferry.gateway.service import Gateway
from ferry.jobs.blobs import S3Keys, blob_store
from ferry.jobs.items import ItemMaker
from ferry.jobs.manifest import Sources
from ferry.jobs.port import Load
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


class GatewayTasks:
    """The jobs engine's port (``jobs.port.Tasks``), as this gateway provides it."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def prepare(self, submission: Submission) -> Envelope:
        return (await self.gateway.prepare(submission)).envelope

    async def admit(self, envelope: Envelope, owner: Owner) -> Admitted:
        return await self.gateway.admit(envelope, owner)

    def watch(self, task_id: str) -> AbstractContextManager[Watch]:
        return self.gateway.waiters.watch(task_id)

    async def cancel(self, task_id: str, client_id: str) -> Cancellation:
        return await self.gateway.store.cancel(task_id, client_id)

    async def load(self, model: str) -> Load:
        backlog = await self.gateway.store.backlog(model)
        capacity = await self.gateway.capacity.of(model)
        return Load(sum(n for priority, n in backlog.items() if priority.interactive),
                    capacity.rate, capacity.batch_s)


def job_parts(gateway: Gateway, settings: GatewaySettings) -> JobParts:
    try:
        sources = Sources.parse(settings.job_sources)
    except ValueError as exc:
        raise ConfigError(f"job_sources: {exc}") from None
    store = JobStore(gateway.parts.hot, record_ttl_s=settings.job_record_ttl_s)
    keys = (S3Keys(settings.s3_access_key_id, settings.s3_secret_access_key)
            if settings.s3_access_key_id else None)
    blobs = blob_store(settings.job_store_url or settings.job_store_dir, settings.s3_endpoint,
                       keys)
    items = ItemMaker(sources, settings.max_body_bytes, settings.s3_endpoint, keys)
    runner = JobRunner(GatewayTasks(gateway), store, blobs, items, RunSettings(
        window=settings.job_window, lease_ms=max(1, round(settings.job_lease_s * 1000))))
    return JobParts(JobsApi(gateway.catalog, store, blobs, sources, settings), runner)
