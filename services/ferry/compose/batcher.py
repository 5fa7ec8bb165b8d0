"""The batcher's parts: its consumer name, connections, queue, task store, backend, metrics."""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ferry.compose.triton import triton_backend
from ferry.errors import ConfigError
from ferry.inference_log.handoff import HandOff, LoggedStore
from ferry.inference_log.record import Shaping
from ferry.queue.base import TaskQueue
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import address, cluster_client, lean, locator
from ferry.resp.client import Commands
from ferry.resp.subscriber import Subscriber
from ferry.settings import BatcherSettings
from ferry.tasks.redis_store import RedisTaskStore
from ferry.telemetry.metrics import BatcherMetrics
from ferry.telemetry.tracing import Tracing
from ferry.triton.base import InferenceBackend
from ferry.triton.pool import Endpoint, PoolHooks, State, TritonPool


@dataclass
class BatcherParts:
    settings: BatcherSettings
    consumer: str
    backend: TritonPool  # every Triton server (a test's one backend, as a pool of one)
    hot: Commands  # completion, and the occasional commands (groups, reclaim, webhooks...)
    queue: TaskQueue  # reads through a blocking lean connection of its own
    store: RedisTaskStore | LoggedStore  # completion, the cancel flags and backlog counts of a
    # partition; reviews' admission and records' reads (``batcher.versions``); with the
    # inference log on, wrapped: each batch's sampled records handed to it once written
    metrics: BatcherMetrics
    listen: Listen  # a subscriber to a channel, made by the batcher with what handles it
    tracing: Tracing  # OTLP traces, when OTEL_* asks for them
    hand_off: HandOff | None = None  # the inference log's (FERRY_LOG_MODELS), closed last


Listen = Callable[[str, Callable[[bytes], None]], Subscriber]


def listener(settings: BatcherSettings, channel: str,
             on_message: Callable[[bytes], None]) -> Subscriber:
    """A subscriber to ``channel`` (its connection named after it), which hands each message
    to ``on_message``."""
    return Subscriber(address(settings), channel, on_message, lambda: None,
                      timeout_s=settings.redis_socket_timeout_s, locate=locator(settings),
                      name=f"ferry-{channel.rpartition(':')[2]}")


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
    reader = lean(settings, f"ferry-reader-{consumer}")
    queue = RedisStreamQueue(hot, reader, partitions=settings.partitions,
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
    metrics = metrics or BatcherMetrics()
    hooks = pool_hooks(metrics)
    hand_off = HandOff(
        hot, settings.log_rates, Shaping(settings.log_max_payload_bytes, settings.log_redacted),
        max_records=settings.log_max_records, metrics=metrics) if settings.log_rates else None
    logged = store if hand_off is None else LoggedStore(store, hand_off)
    return BatcherParts(
        settings=settings, consumer=consumer, listen=functools.partial(listener, settings),
        backend=_as_pool(backend, settings, hooks) if backend is not None else triton_backend(
            settings, infer_timeout_s=settings.infer_timeout_s,
            http_url=settings.triton_http_url, hooks=hooks),
        hot=hot, queue=queue, store=logged, metrics=metrics,
        tracing=Tracing("ferry-batcher"), hand_off=hand_off)


def _as_pool(backend: InferenceBackend, settings: BatcherSettings, hooks: PoolHooks) -> TritonPool:
    """A test's backend as the batcher's pool (a pool as itself)."""
    if isinstance(backend, TritonPool):
        backend.hooks = hooks
        return backend
    return TritonPool.of(backend, settings.triton_grpc_target.split(",")[0], hooks=hooks)


def pool_hooks(metrics: BatcherMetrics) -> PoolHooks:
    """The pool's servers, shown in the batcher's metrics: each one's calls and state, and the
    rows of each call it takes (label children looked up once per server)."""
    batch = functools.lru_cache(maxsize=256)(metrics.endpoint_batch.labels)
    inflight = functools.lru_cache(maxsize=256)(metrics.endpoint_inflight.labels)

    def on_change(endpoints: list[Endpoint]) -> None:
        for endpoint in endpoints:  # each server's series, from when the pool finds it
            inflight(endpoint.name).set(endpoint.inflight)
            batch(endpoint.name)
            for state in State:
                metrics.endpoint_state.labels(endpoint.name, state.value).set(
                    1 if endpoint.state is state else 0)

    return PoolHooks(on_call=lambda endpoint, rows: batch(endpoint).observe(rows),
                     on_inflight=lambda endpoint, calls: inflight(endpoint).set(calls),
                     on_change=on_change)
