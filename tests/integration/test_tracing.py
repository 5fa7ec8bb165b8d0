"""Traces end to end across real processes: a gateway and a batcher export over OTLP/gRPC to a
receiver this test runs (built from opentelemetry-proto's collector service), and each request
yields one connected trace: its gateway span, then under it the queue wait, the batch it joined,
the Triton call and the result write; the batch's own span links to every request span."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from ferry.stack.ports import LOOPBACK, free_port
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, ferry_processes, gateway_settings

pytestmark = pytest.mark.integration


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    links: list[tuple[str, str]]
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


@dataclass
class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(a.value.string_value for a in resource_spans.resource.attributes
                               if a.key == "service.name")
                for scope in resource_spans.scope_spans:
                    self.spans += [_span(service, s) for s in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


def _span(service: str, span: Any) -> Span:
    attributes = {a.key: (a.value.string_value or a.value.int_value) for a in span.attributes}
    return Span(service, span.name, span.trace_id.hex(), span.span_id.hex(),
                span.parent_span_id.hex(), [(k.trace_id.hex(), k.span_id.hex())
                                            for k in span.links],
                attributes, span.start_time_unix_nano, span.end_time_unix_nano)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    got = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        got, server)
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    server.start()
    yield got, port
    server.stop(grace=1)


def test_one_connected_trace_per_request_across_processes(
    redis_url: str, triton_server: TritonServer, receiver: tuple[Receiver, int],
    tmp_path: Path,
) -> None:
    got, port = receiver
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{LOOPBACK}:{port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    gateway = gateway_settings(redis_url, triton_server.grpc_url, port=free_port(), workers=1)
    batcher = batcher_settings(redis_url, triton_server.grpc_url)
    with ferry_processes(gateway, batcher, tmp_path, extra_env=otel) as base:
        with httpx.Client(base_url=base, timeout=30) as client:
            ids = [client.post("/v1/inference?model=sim", content=b"traced %d" % i,
                               headers={"Content-Type": "text/plain"}).json()["task_id"]
                   for i in range(3)]
            assert all(client.get(f"/v1/result/{t}?wait=20").json()["status"] == "SUCCESS"
                       for t in ids)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(
                s.name == "ferry.result_write" for s in list(got.spans)) < 4:
            time.sleep(0.2)
    spans = list(got.spans)
    requests = [s for s in spans if s.service == "ferry-gateway"
                and s.name == "POST /v1/inference"]
    assert len(requests) == 3
    by_id = {s.span_id: s for s in spans}
    for request in requests:
        assert request.attributes["http.response.status_code"] == 202
        in_trace = [s for s in spans if s.trace_id == request.trace_id]
        children = {s.name: s for s in in_trace if s.parent_id == request.span_id}
        assert {"ferry.queue_wait", "ferry.batch"} <= set(children), [s.name for s in in_trace]
        assert children["ferry.queue_wait"].service == "ferry-batcher"
        batch = children["ferry.batch"]
        assert batch.attributes["ferry.batch.flush_reason"] in ("full", "wait", "adaptive")
        under_batch = {s.name for s in in_trace if s.parent_id == batch.span_id}
        assert {"triton.infer", "ferry.result_write"} <= under_batch
        assert children["ferry.queue_wait"].end_ns <= batch.start_ns
        shared = by_id[batch.links[0][1]]  # the batch's own span, in its own trace
        assert shared.name == "ferry.batch" and shared.trace_id != request.trace_id
        assert (request.trace_id, request.span_id) in shared.links
        assert shared.attributes["ferry.batch.size"] == len(shared.links) >= 1


def test_triton_protocol_calls_continue_the_callers_trace(
    redis_url: str, triton_server: TritonServer, receiver: tuple[Receiver, int],
    tmp_path: Path,
) -> None:
    """A gRPC ModelInfer with ``traceparent`` metadata and a REST infer with the header: each
    call's span is a child of the caller's, and its task's spans are under it."""
    got, port = receiver
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{LOOPBACK}:{port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    grpc_port = free_port()
    gateway = gateway_settings(redis_url, triton_server.grpc_url, port=free_port(),
                               grpc_port=grpc_port, workers=1)
    callers = {"ModelInfer": ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),
               "POST /v2/models/{model}/infer": ("4bf92f3577b34da6a3ce929d0e0e4736",
                                                 "00f067aa0ba902b7")}
    parents = {name: f"00-{trace}-{span}-01" for name, (trace, span) in callers.items()}
    word = triton_grpc.InferInput("INPUT", [1, 1], "BYTES")
    word.set_data_from_numpy(np.array([[b"traced over grpc"]], dtype=np.object_))
    with ferry_processes(gateway, batcher_settings(redis_url, triton_server.grpc_url),
                         tmp_path, extra_env=otel) as base:
        with triton_grpc.InferenceServerClient(f"{LOOPBACK}:{grpc_port}") as client:
            client.infer("sim", [word], headers={"traceparent": parents["ModelInfer"]})
        answer = httpx.post(f"{base}/v2/models/sim/infer", timeout=30, headers={
            "traceparent": parents["POST /v2/models/{model}/infer"]}, json={"inputs": [{
                "name": "INPUT", "shape": [1, 1], "datatype": "BYTES", "data": ["over rest"]}]})
        assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(
                s.name == "ferry.result_write" for s in list(got.spans)) < 2:
            time.sleep(0.2)
    spans = list(got.spans)
    for name, (trace_id, parent_id) in callers.items():
        (call,) = [s for s in spans if s.name == name and s.service == "ferry-gateway"]
        assert (call.trace_id, call.parent_id) == (trace_id, parent_id)
        under = {s.name for s in spans if s.parent_id == call.span_id}
        assert {"ferry.queue_wait", "ferry.batch"} <= under, (name, under)
