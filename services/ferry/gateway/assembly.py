"""The gateway room's own parts, made once from the composition root's (``compose.gateway``:
connections, the task store, waiters, access, metrics): the model catalog, the rollouts and
the version picks, the protocol's statistics, the preparation of envelopes, and the one way
in (admission, with shadow copies and idempotency as layers). ``create_app`` assembles them and
hands each route, and the ``Gateway``, the parts it works with: nothing reaches one part
through another."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ferry.compose.gateway import GatewayParts
from ferry.gateway.catalog import ModelCatalog
from ferry.gateway.prepare import Preparer
from ferry.gateway.shadows import Outcome, Shadowing
from ferry.gateway.versions import Versions
from ferry.oip.served import ServedDesk
from ferry.rollouts.store import RolloutStore
from ferry.settings import GatewaySettings
from ferry.tasks.admission import Admitter, Counted, MeasuredLimits
from ferry.tasks.base import Admitted
from ferry.tasks.envelope import Rules
from ferry.tasks.idempotency import IdempotencyKeys
from ferry.tasks.repeats import Idempotent
from ferry.telemetry.metrics import GatewayMetrics
from ferry.v1.task_pb2 import Task


def rules(settings: GatewaySettings) -> Rules:
    """How this gateway makes tasks."""
    return Rules(settings.default_timeout_s, settings.cache_ttl_s, settings.collapse_requests,
                 settings.partitions)


def counting(metrics: GatewayMetrics, served: ServedDesk) -> Counted:
    """What an admission counts: every client task accepted, by version, and each answer
    shared (a cache hit, a collapsed request); a shadow copy counts as sent, not accepted."""
    def counted(task: Task, admitted: Admitted, accepted_at: float) -> None:
        if task.shadow_of:
            return
        model = task.model
        metrics.accepted_child(model, task.model_version).inc()
        if admitted.how != "queued":
            metrics.shared.labels(model, admitted.how, task.model_version).inc()
            served.tally.shared(model, task.model_version, time.time() - accepted_at)
    return counted


def shadows_counted(metrics: GatewayMetrics) -> Callable[[str, Outcome], None]:
    """Each shadow copy counted, sent or dropped."""
    def counted(model: str, outcome: Outcome) -> None:
        metrics.shadows.labels(model, outcome).inc()
    return counted


@dataclass(frozen=True)
class GatewayRoom:
    """The composition root's parts and the gateway room's own, made from them."""

    parts: GatewayParts
    catalog: ModelCatalog  # the models Triton serves, their interfaces and metadata
    rollouts: RolloutStore
    versions: Versions  # which version a request goes to, as the rollouts say
    served: ServedDesk  # the protocol's statistics: answers shared
    preparer: Preparer  # a submission checked against its model, made an envelope
    shadows: Shadowing  # the one way in: admission, with a rollout's shadow copies sent
    idempotent: Idempotent  # a repeat of the same request gets the first one's task


def assemble(parts: GatewayParts) -> GatewayRoom:
    """The gateway room's parts, each made once, with what it works with."""
    s, metrics = parts.settings, parts.metrics
    catalog = ModelCatalog(parts.backend, s.catalog_refresh_s, on_names=metrics.prime)
    rollouts = RolloutStore(parts.hot)
    versions = Versions(rollouts)
    served = ServedDesk(parts.hot)
    preparer = Preparer(catalog, versions, parts.capacity, rules=rules(s),
                        tracing=parts.tracing, default_model=s.default_model)
    limits = MeasuredLimits(parts.capacity, max_backlog=s.max_backlog,
                            max_queue_wait_s=s.max_queue_wait_s, partitions=s.partitions)
    shadows = Shadowing(Admitter(parts.store, limits, counting(metrics, served)), versions,
                        rollouts, shadows_counted(metrics))
    idempotent = Idempotent(IdempotencyKeys(parts.hot), parts.store, parts.waiters,
                            metrics.replayed.inc)
    return GatewayRoom(parts, catalog, rollouts, versions, served, preparer, shadows,
                       idempotent)
