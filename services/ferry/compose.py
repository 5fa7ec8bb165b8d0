"""Where each service's parts are built and wired: the one place to swap a part.

Building a part opens nothing; the service that owns the parts starts and stops them. Tests build
parts with their own pieces (a backend, a metrics registry) and hand them to the service.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from ferry import keys
from ferry.gateway.access import Access
from ferry.queue.redis_streams import RedisStreamQueue
from ferry.redis_conn import SlowRedis, address, cluster_client, connect, lean
from ferry.resp.client import Commands
from ferry.resp.subscriber import Subscriber
from ferry.settings import BatcherSettings, CommonSettings, GatewaySettings, parse_partitions
from ferry.tasks.capacity import CapacityBoard
from ferry.tasks.redis_store import RedisTaskStore
from ferry.tasks.waiters import ResultWaiters
from ferry.telemetry.metrics import BatcherMetrics, GatewayMetrics
from ferry.telemetry.tracing import Tracing
from ferry.triton.base import InferenceBackend
from ferry.triton.grpc_backend import TlsFiles, TritonGrpcBackend


@dataclass
class GatewayParts:
    settings: GatewaySettings
    backend: InferenceBackend
    hot: Commands  # admission and result reads
    redis: SlowRedis  # readiness
    store: RedisTaskStore
    waiters: ResultWaiters
    subscriber: Subscriber  # completion announcements, which wake the waiters
    capacity: CapacityBoard  # the models' measured service rates, for admission
    metrics: GatewayMetrics
    access: Access  # authentication, rate limits, per-client bounds
    tracing: Tracing  # OTLP traces, when OTEL_* asks for them


def gateway_parts(settings: GatewaySettings, *, backend: InferenceBackend | None = None,
                  metrics: GatewayMetrics | None = None) -> GatewayParts:
    hot = lean(settings, "ferry-gateway")
    store = RedisTaskStore(hot, partitions=settings.partitions,
                           result_ttl_s=settings.result_ttl_s,
                           pending_ttl_s=settings.pending_ttl_s)
    waiters = ResultWaiters(store.read)
    subscriber = Subscriber(address(settings), keys.DONE_CHANNEL, waiters.on_announcement,
                            waiters.wake_all, timeout_s=settings.redis_socket_timeout_s)
    return GatewayParts(
        settings=settings,
        backend=backend or triton_backend(settings),
        hot=hot, redis=connect(settings), store=store, waiters=waiters, subscriber=subscriber,
        capacity=CapacityBoard(hot), metrics=metrics or GatewayMetrics(),
        access=Access(settings, hot), tracing=Tracing("ferry-gateway"))


@dataclass
class BatcherParts:
    settings: BatcherSettings
    consumer: str
    backend: InferenceBackend
    hot: Commands  # completion
    redis: SlowRedis  # groups, reclaim, keep-alive, hand-back, depth
    queue: RedisStreamQueue  # reads through a blocking lean connection of its own
    store: RedisTaskStore
    metrics: BatcherMetrics
    cancels: Subscriber  # ids of cancelled tasks (the batcher sets what handles them)
    tracing: Tracing  # OTLP traces, when OTEL_* asks for them


def triton_backend(settings: CommonSettings, infer_timeout_s: float = 30.0) -> TritonGrpcBackend:
    """The Triton client of the settings: plain gRPC, or TLS with their CA and client files."""
    tls = TlsFiles(settings.triton_ca_file, settings.triton_cert_file,
                   settings.triton_key_file) if settings.triton_ssl else None
    return TritonGrpcBackend(settings.triton_grpc_target, tls=tls,
                             infer_timeout_s=infer_timeout_s)


def consumer_name() -> str:
    """Unique per process, readable in XINFO CONSUMERS."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def batcher_parts(settings: BatcherSettings, *, backend: InferenceBackend | None = None,
                  metrics: BatcherMetrics | None = None) -> BatcherParts:
    consumer = consumer_name()
    hot = lean(settings, f"ferry-batcher-{consumer}")
    redis = connect(settings)
    reader = lean(settings, f"ferry-reader-{consumer}")
    queue = RedisStreamQueue(redis, reader, partitions=settings.partitions,
                             owned=parse_partitions(settings.owned_partitions, settings.partitions),
                             consumer=consumer,
                             blocker=(lambda: cluster_client(settings, f"ferry-reader-{consumer}"))
                             if settings.redis_cluster else None)
    store = RedisTaskStore(hot, partitions=settings.partitions,
                           result_ttl_s=settings.result_ttl_s,
                           pending_ttl_s=settings.pending_ttl_s,
                           dead_letter_maxlen=settings.dead_letter_maxlen,
                           cache_ttl_s=settings.cache_ttl_s)
    cancels = Subscriber(address(settings), keys.CANCEL_CHANNEL, lambda message: None,
                         lambda: None, timeout_s=settings.redis_socket_timeout_s)
    return BatcherParts(
        settings=settings, consumer=consumer, cancels=cancels,
        backend=backend or triton_backend(settings, infer_timeout_s=settings.infer_timeout_s),
        hot=hot, redis=redis, queue=queue, store=store, metrics=metrics or BatcherMetrics(),
        tracing=Tracing("ferry-batcher"))
