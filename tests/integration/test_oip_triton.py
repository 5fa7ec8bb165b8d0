"""Tensor requests batched through a real tritonserver: the interface read from its metadata
and config, two requests concatenated into one ModelInfer call and split back by rows, each
part byte for byte what tritonclient.grpc gets for that request alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2

from ferry.oip.spec import ModelInterface, TensorSpec
from ferry.tensors import Tensor, TensorError, concat, split
from ferry.triton.grpc_backend import TritonGrpcBackend, as_dict
from ferry.triton.oip import infer_tensors, model_infer_request
from tests.conftest import TritonServer

pytestmark = pytest.mark.integration


@pytest.fixture
async def backend(triton_server: TritonServer) -> AsyncIterator[TritonGrpcBackend]:
    backend = TritonGrpcBackend(triton_server.grpc_url)
    await backend.start()
    yield backend
    await backend.close()


async def interface(backend: TritonGrpcBackend, model: str) -> ModelInterface:
    metadata = await backend.stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=model),
                                                timeout=5)
    config = await backend.stub.ModelConfig(service_pb2.ModelConfigRequest(name=model), timeout=5)
    return ModelInterface.from_triton(as_dict(metadata), as_dict(config.config))


def request(rows: int, seed: int) -> list[Tensor]:
    generator = np.random.default_rng(seed)
    arrays = [generator.standard_normal((rows, 16), dtype=np.float32) for _ in range(2)]
    return [Tensor(f"INPUT{i}", "FP32", (rows, 16), a.tobytes()) for i, a in enumerate(arrays)]


def alone(url: str, inputs: list[Tensor]) -> dict[str, tuple[tuple[int, ...], bytes]]:
    """What tritonclient.grpc answers for one request on its own: each output's shape, bytes."""
    client = triton_grpc.InferenceServerClient(url)
    try:
        tensors = []
        for tensor in inputs:
            infer_input = triton_grpc.InferInput(tensor.name, list(tensor.shape), "FP32")
            infer_input.set_data_from_numpy(
                np.frombuffer(tensor.raw, dtype=np.float32).reshape(tensor.shape))
            tensors.append(infer_input)
        result: Any = client.infer("simple", tensors)
        return {name: (tuple(result.as_numpy(name).shape), result.as_numpy(name).tobytes())
                for name in ("OUTPUT0", "OUTPUT1")}
    finally:
        client.close()


async def test_two_requests_go_as_one_call_and_each_gets_its_own_rows(
    backend: TritonGrpcBackend, triton_server: TritonServer,
) -> None:
    model = await interface(backend, "simple")
    first, second = model.check(request(1, seed=1)), model.check(request(3, seed=2))
    assert first.signature == second.signature
    batch = [concat(pair) for pair in zip(first.inputs, second.inputs, strict=True)]
    assert [t.shape for t in batch] == [(4, 16), (4, 16)]
    answer = await infer_tensors(backend.stub, model_infer_request("simple", "", batch), 10)
    assert answer.model_version == "1"
    parts = {t.name: split(t, [1, 3]) for t in answer.outputs}
    for index, checked in enumerate((first, second)):
        mine = {name: (rows[index].shape, rows[index].raw) for name, rows in parts.items()}
        assert mine == alone(triton_server.grpc_url, list(checked.inputs))
    a, b = (np.frombuffer(t.raw, dtype="<f4") for t in first.inputs)
    assert np.frombuffer(parts["OUTPUT0"][0].raw, dtype="<f4").tolist() == (a + b).tolist()


async def test_only_the_requested_outputs_come_back(backend: TritonGrpcBackend) -> None:
    model = await interface(backend, "simple")
    checked = model.check(request(2, seed=3), ["OUTPUT1"])
    answer = await infer_tensors(backend.stub, model_infer_request(
        "simple", "1", checked.inputs, checked.outputs), 10)
    assert [(t.name, t.shape) for t in answer.outputs] == [("OUTPUT1", (2, 16))]


async def test_a_request_over_max_batch_size_is_refused_before_triton(
    backend: TritonGrpcBackend,
) -> None:
    model = await interface(backend, "simple")
    with pytest.raises(TensorError, match="9 rows, model 'simple' takes at most 8"):
        model.check(request(9, seed=4))


async def test_the_interfaces_are_read_from_the_real_triton(backend: TritonGrpcBackend) -> None:
    simple = await interface(backend, "simple")
    assert simple.max_batch_size == 8 and simple.versions == ("1",)
    assert simple.inputs == (TensorSpec("INPUT0", "FP32", (16,)),
                             TensorSpec("INPUT1", "FP32", (16,)))
    assert simple.outputs == (TensorSpec("OUTPUT0", "FP32", (16,)),
                              TensorSpec("OUTPUT1", "FP32", (16,)))
    sim = await interface(backend, "sim")
    assert sim.inputs == (TensorSpec("INPUT", "BYTES", (1,)),) and sim.max_batch_size == 64
    engine = await interface(backend, "moderation_trt")  # the ensemble's TensorRT stand-in
    assert engine.inputs == (TensorSpec("images", "FP32", (3, 320, 320)),)
    assert engine.outputs == (TensorSpec("output0", "FP32", (22, 2100)),)
    assert engine.max_batch_size == 64
