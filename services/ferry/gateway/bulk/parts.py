"""Bulk jobs' parts in a gateway: their store, blob store, runner and routes' work."""

from __future__ import annotations

from dataclasses import dataclass

from ferry.errors import ConfigError
from ferry.gateway.bulk.items import ItemMaker
from ferry.gateway.bulk.routes import JobsApi
from ferry.gateway.bulk.runner import JobRunner, RunnerSettings
from ferry.gateway.service import Gateway
from ferry.jobs.blobs import S3Keys, blob_store
from ferry.jobs.manifest import Sources
from ferry.jobs.store import JobStore
from ferry.settings import GatewaySettings


@dataclass(frozen=True)
class JobParts:
    api: JobsApi
    runner: JobRunner


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
    runner = JobRunner(gateway, store, blobs, items, RunnerSettings(
        window=settings.job_window, lease_ms=max(1, round(settings.job_lease_s * 1000))))
    return JobParts(JobsApi(gateway, store, blobs, sources, settings), runner)
