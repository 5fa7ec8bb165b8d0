"""Triton's gRPC service on the gateway: ``tritonclient.grpc`` (and its ``aio`` variant, and its
streaming) pointed at Ferry's gRPC port gets the answers the same client gets from Triton's own
gRPC port, queued and batched; a request that does not fit its model is INVALID_ARGUMENT with
what differs, and nothing is enqueued for it."""

from __future__ import annotations

import asyncio
import hashlib
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ferry.cli import main
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Served,
    executions_counted,
    settled_executions,
    task_keys,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def client(ferry: Served) -> Iterator[triton_grpc.InferenceServerClient]:
    with triton_grpc.InferenceServerClient(ferry.grpc) as ferry_client:
        yield ferry_client


@pytest.fixture
def triton(triton_server: TritonServer) -> Iterator[triton_grpc.InferenceServerClient]:
    with triton_grpc.InferenceServerClient(triton_server.grpc_url) as triton_client:
        yield triton_client


def simple_inputs(rows: int = 1, offset: float = 0.0) -> list[triton_grpc.InferInput]:
    data = np.arange(16 * rows, dtype=np.float32).reshape(rows, 16) + offset
    inputs = []
    for name, values in (("INPUT0", data), ("INPUT1", np.full_like(data, 2.5))):
        tensor = triton_grpc.InferInput(name, [rows, 16], "FP32")
        tensor.set_data_from_numpy(values)
        inputs.append(tensor)
    return inputs


def sim_input(text: bytes) -> list[triton_grpc.InferInput]:
    tensor = triton_grpc.InferInput("INPUT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text]], dtype=np.object_))
    return [tensor]


def same_answer(ours: Any, theirs: Any, outputs: list[str]) -> None:
    for name in outputs:
        mine, real = ours.as_numpy(name), theirs.as_numpy(name)
        assert mine.dtype == real.dtype and mine.shape == real.shape
        if mine.dtype == np.object_:  # BYTES: compare the elements, not their addresses
            assert mine.tolist() == real.tolist()
        else:
            assert mine.tobytes() == real.tobytes()
    mine_json = ours.get_response(as_json=True)
    real_json = theirs.get_response(as_json=True)
    for field in ("model_name", "model_version", "id", "outputs"):
        assert mine_json.get(field) == real_json.get(field), field


def test_health_and_metadata_are_tritons(client: triton_grpc.InferenceServerClient,
                                         triton: triton_grpc.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "ferry"
    assert "binary_tensor_data" in metadata["extensions"]
    for model in ("simple", "sim"):
        assert client.is_model_ready(model) and client.is_model_ready(model, "1")
        assert (client.get_model_metadata(model, as_json=True)
                == triton.get_model_metadata(model, as_json=True))
        assert (client.get_model_config(model, as_json=True)
                == triton.get_model_config(model, as_json=True))
    assert not client.is_model_ready("no_such_model")
    stats = client.get_inference_statistics("simple", as_json=True)
    assert stats["model_stats"][0]["name"] == "simple"


def test_a_planners_sweep_refuses_ferrys_port_and_names_tritons(
        ferry: Served, capsys: pytest.CaptureFixture[str]) -> None:
    """``ferry plan fit --triton-url`` given Ferry's gRPC port (it speaks Triton's protocol)
    would time Ferry's batching and result cache, not the model: a refusal that says so."""
    assert main(["plan", "fit", "--triton-url", ferry.grpc, "--model", "sim",
                 "--batch-sizes", "1,2", "--repeats", "1"]) == 2
    said = capsys.readouterr()
    assert f"{ferry.grpc} is Ferry's gRPC port, not Triton's" in said.out + said.err
    assert "the 'triton' line of ferry up's banner" in said.out + said.err


def test_unknown_models_are_refused_as_triton_refuses_them(
        client: triton_grpc.InferenceServerClient,
        triton: triton_grpc.InferenceServerClient) -> None:
    for call in ("get_model_metadata", "get_model_config"):
        with pytest.raises(InferenceServerException) as ours:
            getattr(client, call)("no_such_model")
        with pytest.raises(InferenceServerException) as theirs:
            getattr(triton, call)("no_such_model")
        assert ours.value.status() == theirs.value.status()
        assert "no_such_model" in str(ours.value.message())


@pytest.mark.parametrize("inputs", ["none", "fitting"])
@pytest.mark.parametrize(("model", "version"), [("nope", ""), ("simple", "7"), ("nope", "1")])
def test_an_unknown_model_or_version_is_not_found_before_its_inputs(
        client: triton_grpc.InferenceServerClient, triton: triton_grpc.InferenceServerClient,
        model: str, version: str, inputs: str) -> None:
    refusals = []
    for server in (client, triton):
        with pytest.raises(InferenceServerException) as refused:
            server.infer(model, simple_inputs() if inputs == "fitting" else [],
                         model_version=version)
        refusals.append((refused.value.status(), refused.value.message()))
    assert refusals[0] == refusals[1]
    assert refusals[0][0] == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("rows", [1, 3])
def test_infer_answers_as_triton(client: triton_grpc.InferenceServerClient,
                                 triton: triton_grpc.InferenceServerClient, rows: int) -> None:
    ours = client.infer("simple", simple_inputs(rows), request_id=f"r-{rows}")
    theirs = triton.infer("simple", simple_inputs(rows), request_id=f"r-{rows}")
    same_answer(ours, theirs, ["OUTPUT0", "OUTPUT1"])
    assert ours.get_response().id == f"r-{rows}"
    only = [triton_grpc.InferRequestedOutput("OUTPUT1")]
    ours = client.infer("simple", simple_inputs(rows), outputs=only)
    assert [o.name for o in ours.get_response().outputs] == ["OUTPUT1"]
    word = client.infer("sim", sim_input(b"hello ferry"), model_version="1")
    same_answer(word, triton.infer("sim", sim_input(b"hello ferry"), model_version="1"),
                ["OUTPUT"])


def test_typed_contents_are_read_as_triton_reads_them(ferry: Served,
                                                      triton_server: TritonServer) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple", id="typed")
    for name, values in (("INPUT0", [float(i) for i in range(16)]), ("INPUT1", [0.5] * 16)):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        tensor.contents.fp32_contents.extend(values)
    answers = []
    for target in (ferry.grpc, triton_server.grpc_url):
        with grpc.insecure_channel(target) as channel:
            answers.append(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request, timeout=30))
    assert answers[0].raw_output_contents == answers[1].raw_output_contents
    assert answers[0].outputs == answers[1].outputs and answers[0].id == "typed"


async def test_the_aio_client_is_served_and_concurrent_requests_are_batched(
        ferry: Served, triton_server: TritonServer) -> None:
    before = await settled_executions(triton_server.grpc_url, "simple")  # earlier tests' too
    async with triton_grpc_aio.InferenceServerClient(ferry.grpc) as client:
        results = await asyncio.gather(*(client.infer("simple",  # new inputs: none cached
                                                      simple_inputs(1, offset=100 + i))
                                         for i in range(16)))
    executions = await executions_counted(triton_server.grpc_url, "simple", before, 16)
    for i, result in enumerate(results):
        expected = np.arange(16, dtype=np.float32) + 100 + i
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], expected + 2.5)
    assert sum(size * n for size, n in executions.items()) == 16
    assert sum(executions.values()) < 16  # Ferry batched what Triton alone runs one by one


def test_a_stream_answers_each_request_by_its_id(client: triton_grpc.InferenceServerClient
                                                 ) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(8):
            client.async_stream_infer("simple", simple_inputs(1, offset=i), request_id=f"s-{i}")
        client.async_stream_infer("sim", sim_input(b"poison pill"), request_id="bad")
        client.async_stream_infer("simple", simple_inputs(1)[:1], request_id="short")
        got = [answers.get(timeout=30) for _ in range(10)]
    finally:
        client.stop_stream()
    errors = [str(error) for result, error in got if error is not None]
    by_id = {result.get_response().id: result for result, error in got if error is None}
    assert sorted(by_id) == [f"s-{i}" for i in range(8)]
    for i in range(8):
        np.testing.assert_array_equal(by_id[f"s-{i}"].as_numpy("OUTPUT1")[0],
                                      np.arange(16, dtype=np.float32) + i - 2.5)
    assert len(errors) == 2
    assert any("poison" in error for error in errors)
    assert any("INPUT1" in error for error in errors)


BAD_REQUESTS = [
    ("wrong datatype", lambda: [_tensor("INPUT0", np.zeros((1, 16), np.int32), "INT32"),
                                simple_inputs()[1]], "INT32"),
    ("wrong shape", lambda: [_tensor("INPUT0", np.zeros((1, 8), np.float32), "FP32"),
                             _tensor("INPUT1", np.zeros((1, 8), np.float32), "FP32")], "[1, 8]"),
    ("unknown input", lambda: [*simple_inputs(), _tensor("EXTRA", np.zeros((1, 16), np.float32),
                                                         "FP32")], "EXTRA"),
    ("missing input", lambda: simple_inputs()[:1], "INPUT1"),
    ("over max_batch_size", lambda: simple_inputs(9), "8"),
]


def _tensor(name: str, values: np.ndarray[Any, Any], datatype: str) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput(name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values)
    return tensor


@pytest.mark.parametrize(("what", "inputs", "named"), BAD_REQUESTS,
                         ids=[bad[0] for bad in BAD_REQUESTS])
def test_a_bad_request_is_invalid_argument_and_nothing_is_enqueued(
        client: triton_grpc.InferenceServerClient, store: redis.Redis, what: str,
        inputs: Any, named: str) -> None:
    before = len(task_keys(store))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("simple", inputs())
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", what
    assert named in str(refused.value.message()), what
    with pytest.raises(InferenceServerException) as unknown_output:
        client.infer("simple", simple_inputs(),
                     outputs=[triton_grpc.InferRequestedOutput("OUTPUT9")])
    assert "OUTPUT9" in str(unknown_output.value.message())
    assert len(task_keys(store)) == before


def test_a_failed_task_is_internal_with_its_reason(
        client: triton_grpc.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as failed:
        client.infer("sim", sim_input(b"poison pill"))
    assert failed.value.status() == "StatusCode.INTERNAL"
    assert "poison" in str(failed.value.message())


def test_respond_async_answers_the_task_id_and_the_record_holds_the_answer(
        client: triton_grpc.InferenceServerClient, ferry: Served) -> None:
    accepted = client.infer("simple", simple_inputs(), request_id="later",
                            parameters={"respond_async": True})
    response = accepted.get_response()
    assert not response.outputs and response.id == "later"
    task_id = response.parameters["task_id"].string_param
    assert response.parameters["status_url"].string_param == f"/v1/result/{task_id}"
    record = httpx.get(f"{ferry.http}/v1/result/{task_id}", params={"wait": 20},
                       timeout=30).json()
    assert record["status"] == "SUCCESS"
    outputs = {o["name"]: o for o in record["output"]["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [i + 2.5 for i in range(16)]
    assert record.get("priority", "normal") == "normal"  # shown only when not normal


def test_priority_and_shared_memory_parameters(client: triton_grpc.InferenceServerClient,
                                               ferry: Served) -> None:
    accepted = client.infer("simple", simple_inputs(offset=200), priority=1,
                            parameters={"respond_async": True})
    task_id = accepted.get_response().parameters["task_id"].string_param
    record = httpx.get(f"{ferry.http}/v1/result/{task_id}", timeout=30).json()
    assert record["priority"] == "high"
    with pytest.raises(InferenceServerException) as refused:
        client.get_system_shared_memory_status()
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "shared memory" in str(refused.value.message())
    with pytest.raises(InferenceServerException) as sequence:
        client.infer("simple", simple_inputs(), sequence_id=7)
    assert sequence.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "sequence" in str(sequence.value.message())


def test_the_readme_example_runs_as_written(ferry: Served,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Triton's protocol", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"127.0.0.1:8001"' in code
    exec(code.replace('"127.0.0.1:8001"', repr(ferry.grpc)), {})  # the README, as written
    printed = capsys.readouterr().out
    assert '"length": 5' in printed and hashlib.sha256(b"hello").hexdigest() in printed


def test_grpc_calls_are_counted_by_method_and_code(client: triton_grpc.InferenceServerClient,
                                                   ferry: Served) -> None:
    client.infer("simple", simple_inputs())
    with pytest.raises(InferenceServerException):
        client.infer("simple", simple_inputs()[:1])
    metrics = httpx.get(f"{ferry.http}/metrics", timeout=10).text
    for code in ("OK", "INVALID_ARGUMENT"):
        assert f'ferry_grpc_requests_total{{code="{code}",method="ModelInfer"}}' in metrics
    assert 'ferry_grpc_request_seconds_count{method="ModelInfer"}' in metrics
