"""The gateway's parts: connections, the task store, result waiters, access, metrics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ferry import keys
from ferry.access import Access
from ferry.compose.triton import triton_backend
from ferry.redis_conn import address, lean, locator
from ferry.resp.client import Commands
from ferry.resp.cluster import ClusterClient
from ferry.resp.sharded import ShardedChannels
from ferry.resp.subscriber import Subscriber
from ferry.settings import GatewaySettings
from ferry.tasks.base import GatewayStore
from ferry.tasks.capacity import CapacityBoard
from ferry.tasks.fairness import Fairness
from ferry.tasks.redis_store import RedisTaskStore
from ferry.tasks.waiters import ResultWaiters
from ferry.telemetry.metrics import GatewayMetrics
from ferry.telemetry.tracing import Tracing
from ferry.triton.base import InferenceBackend


@dataclass
class GatewayParts:
    settings: GatewaySettings
    backend: InferenceBackend
    hot: Commands  # admission, result reads, readiness
    store: GatewayStore
    waiters: ResultWaiters
    subscriber: Subscriber  # completion announcements, which wake the waiters
    sharded: ShardedChannels | None  # on a Redis Cluster: every partition's, where it is
    capacity: CapacityBoard  # the models' measured service rates, for admission
    metrics: GatewayMetrics
    access: Access  # authentication, rate limits, per-client bounds
    tracing: Tracing  # OTLP traces, when OTEL_* asks for them


def sharded_announcements(cluster: ClusterClient, partitions: int, channels: Sequence[str],
                          on_message: Callable[[bytes], None], on_connect: Callable[[], None], *,
                          timeout_s: float = 10.0) -> ShardedChannels:
    """On a Redis Cluster, where a process hears the task ends announced on ``channels``: every
    partition's copy of each (keys.done_shard_channel), on the master that owns it."""
    return ShardedChannels(cluster, [keys.slot_tag(p) for p in range(partitions)], channels,
                           on_message, on_connect, timeout_s=timeout_s)


def gateway_parts(settings: GatewaySettings, *, backend: InferenceBackend | None = None,
                  metrics: GatewayMetrics | None = None) -> GatewayParts:
    hot = lean(settings, "ferry-gateway")
    metrics = metrics or GatewayMetrics()
    store = RedisTaskStore(hot, partitions=settings.partitions,
                           result_ttl_s=settings.result_ttl_s,
                           pending_ttl_s=settings.pending_ttl_s,
                           min_replicas=settings.redis_min_replicas, wait_ms=settings.redis_wait_ms,
                           fairness=Fairness(settings.fair_share_after,
                                             settings.client_weight_map),
                           on_admission_call=metrics.admissions_per_call.observe)
    # The announcements wake the waiters, which listen on them: the listeners call the waiters
    # made just after them (late bound: nothing is heard before ``start``).
    waiters: ResultWaiters

    def heard(message: bytes) -> None:
        waiters.on_announcement(message)

    def lost() -> None:
        waiters.wake_all()

    # this process's own channel, and the one of batchers of an earlier version (an upgrade)
    channels = (keys.done_channel(keys.process_tag()), keys.DONE_CHANNEL)
    subscriber = Subscriber(address(settings), channels, heard, lost,
                            timeout_s=settings.redis_socket_timeout_s, locate=locator(settings))
    sharded = None
    if isinstance(hot, ClusterClient):  # the scripts SPUBLISH in their partition's slot
        sharded = sharded_announcements(hot, settings.partitions, channels[:1], heard, lost,
                                        timeout_s=settings.redis_socket_timeout_s)
    # other processes' channels, while waits need them
    waiters = ResultWaiters(store.read, sharded or subscriber)
    return GatewayParts(
        settings=settings,
        backend=backend or triton_backend(settings),
        hot=hot, store=store, waiters=waiters, subscriber=subscriber,
        sharded=sharded,
        capacity=CapacityBoard(hot), metrics=metrics,
        access=Access(settings, hot), tracing=Tracing("ferry-gateway"))
