"""What the gateway does for a request, apart from HTTP: admit a task, find or wait for a result."""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

from ferry import keys
from ferry.compose import GatewayParts
from ferry.errors import BackendError, BadRequestError
from ferry.gateway.catalog import ModelCatalog
from ferry.gateway.intake import Submission, check_payload
from ferry.tasks.record import Status, StoredRecord, TaskRecord
from ferry.v1.task_pb2 import Task

log = logging.getLogger(__name__)


class Gateway:
    """The gateway's parts, started and stopped together, and the operations its routes call."""

    def __init__(self, parts: GatewayParts) -> None:
        self.parts = parts
        self.settings = parts.settings
        self.metrics = parts.metrics
        self.store = parts.store
        self.waiters = parts.waiters
        self.catalog = ModelCatalog(parts.backend, parts.settings.catalog_refresh_s)

    async def start(self) -> None:
        await self.parts.backend.start()
        await self.parts.subscriber.start()

    async def stop(self) -> None:
        await self.parts.subscriber.stop()  # open long-polls were ended by uvicorn already
        await self.parts.backend.close()
        await self.parts.hot.close()
        await self.parts.redis.aclose()

    async def submit(self, submission: Submission, wait_s: float = 0.0
                     ) -> tuple[str, StoredRecord | None]:
        """Admit the task; with ``wait_s`` > 0, also its final record if it has one by then."""
        spec = await self.catalog.resolve(submission.model or self.settings.default_model)
        if spec.input_kind == "image":
            await asyncio.to_thread(check_payload, spec.input_kind, submission.payload)
        else:
            check_payload(spec.input_kind, submission.payload)
        now = time.time()
        task = Task(task_id=keys.new_task_id(), model=spec.name, payload=submission.payload,
                    content_type=submission.content_type, enqueued_at_ms=int(now * 1000),
                    client_id=submission.client_id)
        pending = TaskRecord(task_id=task.task_id, status=Status.PENDING, model=spec.name,
                             created_at=now)
        if wait_s <= 0:
            await self.store.admit(task, pending)
            self.metrics.accepted.labels(spec.name).inc()
            return task.task_id, None
        with self.waiters.watch(task.task_id) as watch:  # before admission: no completion missed
            admitted = await self.store.admit(task, pending)
            self.metrics.accepted.labels(spec.name).inc()
            try:
                record = await watch.final(wait_s, admitted, read_first=False)
            except Exception:  # accepted is accepted: the client polls instead of retrying
                log.exception("waiting for task %s failed; answering 202", task.task_id)
                return task.task_id, None
        return task.task_id, record if record is not None and record.status.final else None

    async def result(self, task_id: str, wait_s: float) -> StoredRecord:
        """The task's record, waiting up to ``wait_s`` for a final one; 404 if there is none."""
        if not 0 <= wait_s <= self.settings.max_poll_s:
            raise BadRequestError("invalid_wait", f"'wait' must be between 0 and "
                                  f"{self.settings.max_poll_s:g} seconds, got {wait_s:g}")
        record = None
        if keys.is_task_id(task_id):
            if wait_s > 0:
                with self.waiters.watch(task_id) as watch:
                    record = await watch.final(wait_s)
            else:
                record = await self.store.read(task_id)
        if record is None:
            raise BadRequestError("unknown_task", f"no task {task_id!r}: it never existed, or its "
                                  f"result expired ({self.settings.result_ttl_s} s after "
                                  "it finished)", 404)
        return record

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        checks: dict[str, str] = {}
        try:
            await self.parts.redis.ping()
            checks["redis"] = "ok"
        except (RedisError, OSError) as exc:
            checks["redis"] = f"unreachable: {exc}"
        checks["triton"] = "ok" if await self.parts.backend.server_ready() else "not ready"
        try:
            models = await self.parts.backend.ready_models()
            ok = self.settings.default_model in models
            checks["default_model"] = "ok" if ok else f"{self.settings.default_model!r} not ready"
        except BackendError as exc:
            checks["default_model"] = f"unknown: {exc}"
        return all(v == "ok" for v in checks.values()), checks
