"""The batcher's parts: its consumer name, connections, queue, task store, backend, metrics."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from ferry import keys
from ferry.compose.triton import triton_backend
from ferry.errors import ConfigError
from ferry.queue.base import TaskQueue
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import SlowRedis, address, cluster_client, connect, lean, locator
from ferry.resp.client import Commands
from ferry.resp.subscriber import Subscriber
from ferry.settings import BatcherSettings
from ferry.tasks.redis_store import RedisTaskStore
from ferry.telemetry.metrics import BatcherMetrics
from ferry.telemetry.tracing import Tracing
from ferry.triton.base import InferenceBackend


@dataclass
class BatcherParts:
    settings: BatcherSettings
    consumer: str
    backend: InferenceBackend
    hot: Commands  # completion
    redis: SlowRedis  # groups, webhooks, cluster-mode check
    queue: TaskQueue  # reads through a blocking lean connection of its own
    store: RedisTaskStore  # completion, the cancel flags and backlog counts of a partition;
    # reviews' admission and records' reads (``batcher.versions``)
    metrics: BatcherMetrics
    cancels: Subscriber  # ids of cancelled tasks (the batcher sets what handles them)
    tracing: Tracing  # OTLP traces, when OTEL_* asks for them


def consumer_name() -> str:
    """Unique per process, readable in XINFO CONSUMERS."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def batcher_parts(settings: BatcherSettings, *, backend: InferenceBackend | None = None,
                  metrics: BatcherMetrics | None = None) -> BatcherParts:
    if settings.follows_replicas:
        raise ConfigError("owned_partitions=auto: the supervisor starts each batcher on its "
                          "own list of partitions")
    consumer = consumer_name()
    hot = lean(settings, f"ferry-batcher-{consumer}")
    redis = connect(settings)
    reader = lean(settings, f"ferry-reader-{consumer}")
    queue = RedisStreamQueue(redis, reader, partitions=settings.partitions,
                             owned=settings.owned,
                             consumer=consumer,
                             blocker=(lambda: cluster_client(settings, f"ferry-reader-{consumer}"))
                             if settings.redis_cluster else None)
    store = RedisTaskStore(hot, partitions=settings.partitions,
                           result_ttl_s=settings.result_ttl_s,
                           pending_ttl_s=settings.pending_ttl_s,
                           dead_letter_maxlen=settings.dead_letter_maxlen,
                           cache_ttl_s=settings.cache_ttl_s,
                           min_replicas=settings.redis_min_replicas, wait_ms=settings.redis_wait_ms)
    cancels = Subscriber(address(settings), keys.CANCEL_CHANNEL, lambda message: None,
                         lambda: None, timeout_s=settings.redis_socket_timeout_s,
                         locate=locator(settings))
    return BatcherParts(
        settings=settings, consumer=consumer, cancels=cancels,
        backend=backend or triton_backend(settings, infer_timeout_s=settings.infer_timeout_s,
                                          http_url=settings.triton_http_url),
        hot=hot, redis=redis, queue=queue, store=store, metrics=metrics or BatcherMetrics(),
        tracing=Tracing("ferry-batcher"))
