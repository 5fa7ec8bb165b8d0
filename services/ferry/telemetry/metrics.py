"""Prometheus metrics, created per process at start-up in a registry the process owns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 96, 128)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class BatcherMetrics:
    """What a batcher measures: batch sizes, Triton time, outcomes, waiting."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.batch_size = Histogram("ferry_batch_size", "Requests per Triton infer call",
                                    ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.infer_seconds = Histogram("ferry_infer_seconds", "Duration of one Triton infer call",
                                       ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("ferry_queue_wait_seconds",
                                    "From acceptance by the gateway to departure in a batch",
                                    ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.finished = Counter("ferry_tasks_finished_total", "Tasks given a final status",
                                ["model", "status"], registry=r)
        self.infer_failures = Counter("ferry_infer_failures_total", "Failed Triton infer calls",
                                      ["model", "kind"], registry=r)
        self.reclaimed = Counter("ferry_tasks_reclaimed_total",
                                 "Tasks taken over from a consumer that went idle", registry=r)
        self.dead_lettered = Counter("ferry_tasks_dead_lettered_total",
                                     "Tasks written to the dead-letter stream", registry=r)
        self.buffered = Gauge("ferry_buffered_tasks", "Tasks read and waiting for a batch",
                              registry=r)
        self.inflight = Gauge("ferry_inflight_batches", "Batches at Triton now", registry=r)
        self.queue_depth = Gauge("ferry_queue_depth",
                                 "Unfinished tasks in all partition streams (new and pending)",
                                 registry=r)


class GatewayMetrics:
    """What a gateway measures: requests by route and outcome, accepted tasks."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("ferry_http_requests_total", "HTTP requests answered",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("ferry_http_request_seconds", "HTTP request duration",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, registry=r)
        self.accepted = Counter("ferry_tasks_accepted_total", "Tasks enqueued", ["model"],
                                registry=r)
        self.rejected = Counter("ferry_requests_rejected_total", "Requests refused with a 4xx",
                                ["reason"], registry=r)
