"""Prometheus metrics, created per process at start-up in a registry the process owns.

A gateway run as several worker processes (``--workers``) uses prometheus_client's multiprocess
mode: ``PROMETHEUS_MULTIPROC_DIR`` is set before the workers start, each writes its values there,
and ``/metrics`` on any worker reports the sum over all of them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from ferry.priority import Priority
from ferry.usage.labels import OTHER as OTHER_CLIENTS

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 96, 128)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
# Label values every process shows from start-up (``prime``), at 0 until they count.
FLUSH_REASONS = ("full", "wait", "adaptive", "priority", "deadline", "freed", "drain")
FINAL_STATUSES = ("SUCCESS", "FAILED", "EXPIRED", "CANCELLED")
REFUSALS = (("429", "backlog_full"), ("429", "deadline_unmeetable"), ("429", "rate_limited"),
            ("429", "too_many_pending"), ("429", "too_many_waits"), ("503", "unavailable"),
            ("503", "circuit_open"), ("503", "not_replicated"), ("503", "redis_out_of_memory"))
HOT_ROUTES = (("/v1/inference", "POST", "202"), ("/v1/inference", "POST", "200"),
              ("/v1/result/{task_id}", "GET", "200"))


class BatcherMetrics:
    """What a batcher measures: batch sizes, why batches left, Triton time, outcomes, waiting."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.batch_size = Histogram("ferry_batch_size", "Rows per Triton infer call (a one-BYTES "
                                    "request: one), by the version that answered", ["model",
                                    "version"], buckets=BATCH_BUCKETS, registry=r)
        self.flushes = Counter("ferry_batch_flush_total", "Batches sent, by why they left: full, "
                               "wait (max wait reached), adaptive (nobody else coming), drain",
                               ["model", "reason"], registry=r)
        self.infer_seconds = Histogram("ferry_infer_seconds", "Duration of one Triton infer "
                                       "call, by the version that answered", ["model", "version"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("ferry_queue_wait_seconds", "From acceptance by the gateway "
                                    "to departure in a batch, by the version asked for ('': "
                                    "Triton's policy picks)", ["model", "version"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.finished = Counter("ferry_tasks_finished_total", "Tasks given a final status, by "
                                "the version that answered (or was asked for)",
                                ["model", "status", "version"], registry=r)
        self.rollout_share, self.rollout_decisions = _rollout_metrics(r)
        self.infer_failures = Counter("ferry_infer_failures_total", "Failed Triton infer calls",
                                      ["model", "kind"], registry=r)
        self.reclaimed, self.dead_lettered, self.settle_retries = _recovery_metrics(r)
        self.buffered = Gauge("ferry_buffered_tasks", "Tasks read, waiting for a batch", registry=r)
        self.inflight, self.dispatch_gap = _dispatch_metrics(r)
        self._pool_metrics(r)
        self.webhooks, self.log_records, self.log_dropped = _outbound_metrics(r)
        self.circuit, self.window = _model_gauges(r)
        self.queue_depth, self.partition_depth, self.partition_pending = _depth_metrics(r)
        self.client_tasks, self.client_gpu, self.client_wait = _client_metrics(r)
        # label children by their values, looked up per task: labels() costs more than a dict
        self.finished_child = functools.lru_cache(maxsize=4096)(self.finished.labels)
        self.queue_wait_child = functools.lru_cache(maxsize=4096)(self.queue_wait.labels)
        self.client_tasks_child = functools.lru_cache(maxsize=4096)(self.client_tasks.labels)
        self.client_gpu_child = functools.lru_cache(maxsize=4096)(self.client_gpu.labels)
        self.client_wait_child = functools.lru_cache(maxsize=4096)(self.client_wait.labels)
        self._call_children = functools.lru_cache(maxsize=4096)(
            lambda model, version: (self.infer_seconds.labels(model, version),
                                    self.batch_size.labels(model, version)))

    def _pool_metrics(self, registry: CollectorRegistry) -> None:
        (self.endpoint_inflight, self.endpoint_batch, self.endpoint_state, self.budget_wait,
         self.budget_shared, self.budget_riders) = _pool_metrics(registry)

    def prime(self, models: Iterable[str]) -> None:
        """Make each model's series of known label values exist at 0 (a series that appears
        only when it first counts breaks absent-series alerts and rate() over its start)."""
        for model in models:
            self.batch_size.labels(model, "")
            self.budget_wait.labels(model)
            self.budget_riders.labels(model)
            self.infer_seconds.labels(model, "")
            self.queue_wait.labels(model, "")
            self.dispatch_gap.labels(model)
            for reason in FLUSH_REASONS:
                self.flushes.labels(model, reason)
            for status in FINAL_STATUSES:
                self.finished.labels(model, status, "")
            for kind in ("transient", "permanent"):
                self.infer_failures.labels(model, kind)
            self.circuit.labels(model, "")
            self.window.labels(model)
            self.rollout_share.labels(model, "")  # no candidate: 0
            for action in ("step", "promote", "rollback"):
                self.rollout_decisions.labels(model, action)
            self.client_tasks.labels(OTHER_CLIENTS, model)
            self.client_gpu.labels(OTHER_CLIENTS, model)
            self.log_records.labels(model)
            for reason in LOG_DROP_REASONS:
                self.log_dropped.labels(model, reason)
        for priority in Priority:
            self.client_wait.labels(OTHER_CLIENTS, priority.label)
        for outcome in ("delivered", "failed"):
            self.webhooks.labels(outcome)
        self.settle_retries.labels("OOM")

    def observe_call(self, model: str, version: str, size: int, seconds: float) -> None:
        """One Triton call of ``size`` rows, answered by ``version`` in ``seconds``."""
        infer_seconds, batch_size = self._call_children(model, version)
        infer_seconds.observe(seconds)
        batch_size.observe(size)


def _client_metrics(r: CollectorRegistry) -> tuple[Counter, Counter, Histogram]:
    """What each client costs and how long its tasks wait, by a bounded set of client labels
    (``ferry.usage.labels``: the clients that cost the most, the rest ``other``)."""
    return (Counter("ferry_client_tasks_total", "Tasks given a final status, by client (the "
                    "most costly named, the rest 'other') and the model asked for",
                    ["client", "model"], registry=r),
            Counter("ferry_client_gpu_seconds_total", "Triton time of the calls that answered "
                    "a client's tasks, each task's share by its rows", ["client", "model"],
                    registry=r),
            Histogram("ferry_client_queue_wait_seconds", "From acceptance by the gateway to "
                      "departure in a batch, by client and priority", ["client", "priority"],
                      buckets=LATENCY_BUCKETS, registry=r))


LOG_DROP_REASONS = ("full", "busy", "error")


def _outbound_metrics(r: CollectorRegistry) -> tuple[Counter, Counter, Counter]:
    """What leaves for the outside: webhooks; and the inference log's hand-off
    (docs/inference-log.md), records handed to a model's log stream and records dropped rather
    than wait (the request path never does)."""
    return (Counter("ferry_webhooks_total", "Webhooks sent, by outcome: delivered (a 2xx) or "
                    "failed (retries spent)", ["outcome"], registry=r),
            Counter("ferry_log_records_total", "Sampled tasks' records handed to the inference "
                    "log's stream of their model", ["model"], registry=r),
            Counter("ferry_log_dropped_total", "Sampled tasks' records dropped: the model's "
                    "log stream at its bound (full), hand-offs queued past their bound (busy), "
                    "or a Redis error (error)", ["model", "reason"], registry=r))


def _recovery_metrics(r: CollectorRegistry) -> tuple[Counter, Counter, Counter]:
    return (Counter("ferry_tasks_reclaimed_total",
                    "Tasks taken over from a batcher whose lease ran out (or, with no lease, "
                    "that left them idle)", registry=r),
            Counter("ferry_tasks_dead_lettered_total",
                    "Tasks written to the dead-letter streams", registry=r),
            Counter("ferry_settle_retries_total", "Writes of results that Redis refused (by "
                    "its reason: OOM, READONLY, LOADING...) or that failed (connection), tried "
                    "again", ["reason"], registry=r))


class GatewayMetrics:
    """What a gateway measures: requests by route and outcome, accepted and refused tasks."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # Read once, when the gateway (or one of its workers) starts: serve() sets it before
        # the workers start, and prometheus_client reads the same variable for its values.
        self.multiprocess = bool(os.environ.get(MULTIPROCESS_DIR))
        r = self.registry
        self.requests = Counter("ferry_http_requests_total", "HTTP requests answered",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("ferry_http_request_seconds", "HTTP request duration",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, registry=r)
        self.accepted = Counter("ferry_tasks_accepted_total", "Tasks enqueued, by the version "
                                "they pin or a rollout gave them ('': Triton's policy picks)",
                                ["model", "version"], registry=r)
        self.shadows = Counter("ferry_shadow_tasks_total", "Copies of requests sent to a "
                               "rollout's candidate (sent), or dropped for a high backlog",
                               ["model", "outcome"], registry=r)
        self.rejected = Counter("ferry_requests_rejected_total", "Requests refused, by HTTP status "
                                "and error code (429 overload, 404 unknown task, ...)",
                                ["status", "reason"], registry=r)
        self.shared = Counter("ferry_tasks_shared_total", "Tasks that cost no inference of their "
                              "own: answered from the result cache (hit) or collapsed onto an "
                              "identical task in flight", ["model", "how", "version"],
                              registry=r)
        self.replayed = Counter("ferry_idempotent_replays_total", "Requests answered with the "
                                "task an earlier request with the same Idempotency-Key created",
                                registry=r)
        self.cancelled = Counter("ferry_tasks_cancelled_total", "Tasks cancelled by their client",
                                 registry=r)
        self.admissions_per_call = Histogram(
            "ferry_admissions_per_call", "Admissions one Redis call carried (those that arrived "
            "while the last call was out)", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r)
        self.rpcs, self.rpc_latency = _rpc_metrics(r)
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._rpc_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self.accepted_child = functools.lru_cache(maxsize=4096)(self.accepted.labels)

    def prime(self, models: Iterable[str]) -> None:
        """Make the series of known label values exist at 0, for each model and for the hot
        routes (a series that appears only when it first counts breaks absent-series alerts
        and rate() over its start)."""
        for model in models:
            self.accepted.labels(model, "")
            for outcome in ("sent", "dropped"):
                self.shadows.labels(model, outcome)
            for how in ("hit", "collapsed"):
                self.shared.labels(model, how, "")
        for status, reason in REFUSALS:
            self.rejected.labels(status, reason)
        for route, method, status in HOT_ROUTES:
            self.requests.labels(route, method, status)
            self.latency.labels(route, method)
        for method in ("ModelInfer", "ModelStreamInfer"):
            self.rpcs.labels(method, "OK")
            self.rpc_latency.labels(method)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request (label children are cached: this is on every request)."""
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:
            children = (self.requests.labels(route, method, str(status)),
                        self.latency.labels(route, method))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """Count one answered gRPC call (or request of a stream)."""
        children = self._rpc_children.get((method, code))
        if children is None:  # labels() per call cost 3-4% of the gRPC front's CPU
            children = (self.rpcs.labels(method, code), self.rpc_latency.labels(method))
            self._rpc_children[(method, code)] = children
        children[0].inc()
        children[1].observe(seconds)

    def exposition(self) -> bytes:
        """The text /metrics serves: this process's registry, or every worker's in multiprocess
        mode."""
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped library
            return generate_latest(registry)
        return generate_latest(self.registry)


def _rpc_metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    """The gateway's gRPC calls (a stream: each request of it) by method and status code, and
    their durations."""
    return (Counter("ferry_grpc_requests_total", "gRPC calls answered (a stream: each request of "
                    "it), by method and status code", ["method", "code"], registry=registry),
            Histogram("ferry_grpc_request_seconds", "gRPC call duration (a stream: each "
                      "request's)", ["method"], buckets=LATENCY_BUCKETS, registry=registry))


def _model_gauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge]:
    """Each model version's circuit breaker and each model's in-flight window."""
    return (Gauge("ferry_circuit_state", "Each model version's circuit breaker ('': the version "
                  "Triton's policy picks): 0 closed, 1 half-open, 2 open", ["model", "version"],
                  registry=registry),
            Gauge("ferry_inflight_window", "Batches of a model allowed at Triton at once (its "
                  "instances, less while calls run slow)", ["model"], registry=registry))


def _depth_metrics(registry: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge]:
    """How much work waits: in every stream, and per partition this batcher owns."""
    return (Gauge("ferry_queue_depth", "Unfinished tasks in all partition streams (new and "
                  "pending)", registry=registry),
            Gauge("ferry_partition_depth", "Unfinished tasks of a partition this batcher owns "
                  "(all priorities)", ["partition"], registry=registry),
            Gauge("ferry_partition_pending", "Tasks of a partition this batcher owns that a "
                  "batcher holds (read, not finished)", ["partition"], registry=registry))


def _rollout_metrics(registry: CollectorRegistry) -> tuple[Gauge, Counter]:
    """What the rollouts' keeper reports (on the batcher that owns partition 0)."""
    return (Gauge("ferry_rollout_candidate_share", "Percent of a model's requests its rollout's "
                  "candidate answers", ["model", "candidate"], registry=registry),
            Counter("ferry_rollout_decisions_total", "Rollout changes the guard made: step, "
                    "promote, rollback", ["model", "action"], registry=registry))


def _pool_metrics(registry: CollectorRegistry
                  ) -> tuple[Gauge, Histogram, Gauge, Histogram, Gauge, Counter]:
    """The Triton servers of the pool (their series exist once the pool has found its
    servers), and the fleet's shared in-flight budget."""
    return (Gauge("ferry_endpoint_inflight", "This batcher's calls at each Triton server now",
                  ["endpoint"], registry=registry),
            Histogram("ferry_endpoint_batch_size", "Rows of each call, by the Triton server it "
                      "went to", ["endpoint"], buckets=BATCH_BUCKETS, registry=registry),
            Gauge("ferry_endpoint_state", "Each Triton server's state as this batcher sees it: "
                  "1 for its state (ready, down, draining), 0 for the others",
                  ["endpoint", "state"], registry=registry),
            Histogram("ferry_budget_wait_seconds", "A batch's wait for a slot of its model's "
                      "shared in-flight budget (the fleet's instances all busy)", ["model"],
                      buckets=GAP_BUCKETS, registry=registry),
            Gauge("ferry_budget_shared", "1 while this batcher's in-flight budget is shared "
                  "with other batchers through Redis, 0 while counted here alone",
                  registry=registry),
            Counter("ferry_budget_riders_total", "Tasks another batcher held, waiting for a slot "
                    "of the shared budget, that rode a batch of this one's (one queue for the "
                    "fleet)", ["model"], registry=registry))


GAP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def _dispatch_metrics(registry: CollectorRegistry) -> tuple[Gauge, Histogram]:
    """Batches at Triton now, and how long a model's work waits after one of its calls ended:
    from the call's end, with tasks of the model boarded, to its next batch leaving (a GPU slot
    idle while work waits)."""
    return (Gauge("ferry_inflight_batches", "Batches at Triton now", registry=registry),
            Histogram("ferry_dispatch_gap_seconds", "From a Triton call's end, with the model's "
                      "tasks waiting, to its next batch leaving", ["model"],
                      buckets=GAP_BUCKETS, registry=registry))


class LoggerMetrics:
    """What the inference log's logger measures (``ferry logger``): records the sink holds,
    its failures, and what waits in each model's stream."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.written = Counter("ferry_log_written_total", "Records the sink holds (then "
                               "acknowledged and deleted from the model's log stream)",
                               ["model"], registry=r)
        self.failures = Counter("ferry_log_sink_failures_total", "Writes the sink refused or "
                                "failed (each retried, with backoff, until it takes them)",
                                registry=r)
        self.sink_up = Gauge("ferry_log_sink_up", "1 while the sink takes records, 0 from a "
                             "failed write until one succeeds", registry=r)
        self.waiting = Gauge("ferry_log_stream_length", "Records in a model's log stream: not "
                             "yet held by the sink (its bound is FERRY_LOG_MAX_RECORDS)",
                             ["model"], registry=r)

    def prime(self, models: Iterable[str]) -> None:
        """Each logged model's series, at 0 until it counts."""
        for model in models:
            self.written.labels(model)
            self.waiting.labels(model)
        self.sink_up.set(1)
