"""Traces: OpenTelemetry spans exported over OTLP/gRPC, configured by the standard ``OTEL_*``
variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``..._TRACES_ENDPOINT`` turns them on;
``OTEL_TRACES_SAMPLER``/``_ARG`` sample; ``OTEL_SERVICE_NAME`` renames), off otherwise: then
every hook is one test of a flag.

One trace per request: the gateway's span of the HTTP request, whose W3C context travels in the
task's envelope; in the batcher, under it, the time the task waited in the queue, the batch it
joined, the Triton call(s) and the result write. The batch itself is also one span of its own
trace, linked to every request span it carried, with its size and why it left.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

PROPAGATOR = TraceContextTextMapPropagator()


def configured(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (an OTLP endpoint, and the SDK not disabled)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    """A service's tracer, or nothing at all when traces are off."""

    def __init__(self, service: str, environ: Mapping[str, str] | None = None) -> None:
        # The standard OTEL_* variables, read once when the service builds its parts at start-up
        # (the OpenTelemetry SDK reads the rest of them itself): not Ferry's settings.
        environ = os.environ if environ is None else environ
        self.enabled = configured(environ)
        self.service = environ.get("OTEL_SERVICE_NAME") or service
        self._provider: TracerProvider | None = None
        self.tracer: trace.Tracer = trace.NoOpTracer()

    def start(self) -> None:
        if self.enabled and self._provider is None:
            self._provider = TracerProvider(
                resource=Resource.create({"service.name": self.service}))
            self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            self.tracer = self._provider.get_tracer("ferry")

    def shutdown(self) -> None:
        """Export what is left, then stop."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self.tracer = trace.NoOpTracer()

    @contextmanager
    def server_span(self, name: str, headers: Mapping[str, str]) -> Iterator[trace.Span | None]:
        """The span of one HTTP request (a child of the caller's, if it sent a traceparent),
        current for the block; None when traces are off."""
        if self._provider is None:
            yield None
            return
        parent = PROPAGATOR.extract(headers)
        with self.tracer.start_as_current_span(name, context=parent,
                                               kind=SpanKind.SERVER) as span:
            yield span

    def inject(self, carrier: MutableMapping[str, str]) -> None:
        """Write the current span's context (traceparent) into ``carrier``."""
        if self._provider is not None:
            PROPAGATOR.inject(carrier)


def context_of(carrier: Mapping[str, str]) -> Context | None:
    """The context a task's envelope carries, if it names a sampled span."""
    if not carrier:
        return None
    context = PROPAGATOR.extract(carrier)
    span = trace.get_current_span(context).get_span_context()
    return context if span.is_valid and span.trace_flags.sampled else None


@dataclass
class Interval:
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass
class BatchTrace:
    """What happened to one batch, recorded as it runs and emitted as spans when it is done:
    its Triton calls and result writes, timed by the executor."""

    model: str
    reason: str
    members: list[tuple[Context, int]]  # each sampled task's context, and its enqueue time (ms)
    size: int
    started_ns: int = field(default_factory=time.time_ns)
    steps: list[Interval] = field(default_factory=list)

    def step(self, name: str, start_ns: int,
             attributes: dict[str, AttributeValue] | None = None) -> None:
        self.steps.append(Interval(name, start_ns, time.time_ns(), attributes or {}))

    def emit(self, tracer: trace.Tracer) -> None:
        ended = time.time_ns()
        attributes: dict[str, AttributeValue] = {
            "ferry.model": self.model, "ferry.batch.size": self.size,
            "ferry.batch.flush_reason": self.reason}
        links = [Link(_span_context(c)) for c, _ in self.members]
        batch = tracer.start_span("ferry.batch", start_time=self.started_ns, links=links,
                                  attributes=attributes)
        self._children(tracer, trace.set_span_in_context(batch))
        batch.end(end_time=ended)
        shared = Link(batch.get_span_context())
        for context, enqueued_ms in self.members:
            waited = tracer.start_span("ferry.queue_wait", context=context,
                                       start_time=enqueued_ms * 1_000_000)
            waited.end(end_time=max(self.started_ns, enqueued_ms * 1_000_000))
            own = tracer.start_span("ferry.batch", context=context, start_time=self.started_ns,
                                    links=[shared], attributes=attributes)
            self._children(tracer, trace.set_span_in_context(own))
            own.end(end_time=ended)

    def _children(self, tracer: trace.Tracer, parent: Context) -> None:
        for step in self.steps:
            tracer.start_span(step.name, context=parent, start_time=step.start_ns,
                              attributes=step.attributes).end(end_time=step.end_ns)


def _span_context(context: Context) -> SpanContext:
    return trace.get_current_span(context).get_span_context()


CURRENT_BATCH: contextvars.ContextVar[BatchTrace | None] = contextvars.ContextVar(
    "ferry_batch_trace", default=None)


def batch_trace(model: str, reason: str, envelopes: Sequence[tuple[Mapping[str, str], int]]
                ) -> BatchTrace | None:
    """A batch's recorder if any of its tasks is traced (sampled); None otherwise."""
    members = [(c, ms) for carrier, ms in envelopes if (c := context_of(carrier)) is not None]
    return BatchTrace(model, reason, members, len(envelopes)) if members else None
