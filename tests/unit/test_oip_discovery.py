"""The pure parts of Triton's REST discovery: replies in Triton's HTTP JSON shape, and its
error statuses."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2, service_pb2

from ferry.errors import PermanentBackendError, TransientBackendError, UnknownModelError
from ferry.oip.rest import NotFound, checked, status_of
from ferry.triton.http_json import triton_json


def test_64_bit_integers_are_numbers_and_defaults_are_written() -> None:
    reply = service_pb2.ModelMetadataResponse(name="m", versions=["1"], platform="python")
    reply.inputs.add(name="x", datatype="FP32", shape=[-1, 3])
    assert triton_json(reply) == {"name": "m", "versions": ["1"], "platform": "python",
                                  "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
                                  "outputs": []}


def test_nested_messages_and_maps_are_converted() -> None:
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[3, 224])
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.parameters["k"].string_value = "v"
    data = triton_json(config)
    assert data["input"][0]["dims"] == [3, 224]
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["parameters"] == {"k": {"string_value": "v"}}
    assert data["platform"] == ""  # a default, written as Triton writes it


def test_statistics_counts_are_numbers() -> None:
    stats = service_pb2.ModelStatisticsResponse()
    model = stats.model_stats.add(name="m", version="1", inference_count=5)
    model.inference_stats.success.count = 5
    model.batch_stats.add(batch_size=4).compute_infer.ns = 12
    data = triton_json(stats)["model_stats"][0]
    assert data["inference_count"] == 5 and data["inference_stats"]["success"]["count"] == 5
    assert data["batch_stats"][0]["batch_size"] == 4
    assert data["batch_stats"][0]["compute_infer"] == {"count": 0, "ns": 12}


@pytest.mark.parametrize(("error", "status"), [
    (UnknownModelError("x", code="NOT_FOUND"), 404),
    (PermanentBackendError("x", code="INVALID_ARGUMENT"), 400),
    (PermanentBackendError("x", code="UNIMPLEMENTED"), 501),
    (PermanentBackendError("x", code="INTERNAL"), 500),
    (TransientBackendError("x", code="UNAVAILABLE"), 503),
    (TransientBackendError("x", code="DEADLINE_EXCEEDED"), 503),
    (PermanentBackendError("x"), 503),
])
def test_statuses_are_tritons(error: PermanentBackendError, status: int) -> None:
    assert status_of(error) == status


def test_a_refusal_keeps_the_servers_words() -> None:
    error = UnknownModelError("model 'x': NOT_FOUND: gone", code="NOT_FOUND", reason="gone")
    assert error.reason == "gone" and str(error) == "model 'x': NOT_FOUND: gone"
    assert PermanentBackendError("plain").reason == "plain"


def test_a_version_is_digits_or_none() -> None:
    assert checked("") == "" and checked("12") == "12"
    with pytest.raises(NotFound):
        checked("abc")
