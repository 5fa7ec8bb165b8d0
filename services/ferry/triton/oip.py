"""Tensors through Triton's gRPC ModelInfer: a batch of tensor requests as one call.

The inputs are the requests' tensors already concatenated along the batch dimension
(``ferry.tensors.concat``); they travel in ``raw_input_contents`` and the outputs come back in
``raw_output_contents``, each checked against its shape before ``ferry.tensors.split`` gives
every request its rows. Pure apart from ``infer_tensors``, whose gRPC errors become Ferry's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.errors import PermanentBackendError
from ferry.tensors import Tensor, TensorError, checked
from ferry.triton.grpc_errors import translate
from ferry.triton.http_infer import InferReply


def add_raw_tensors(entries: Any, raw_contents: Any, tensors: Sequence[Tensor]) -> None:
    """Each tensor's name, datatype and shape into ``entries`` (a request's inputs or a
    response's outputs) and its bytes into ``raw_contents``, as Triton's raw contents carry
    them."""
    for tensor in tensors:
        entry = entries.add()
        entry.name = tensor.name
        entry.datatype = tensor.datatype
        entry.shape.extend(tensor.shape)
        raw_contents.append(tensor.raw)


def model_infer_request(model: str, version: str, inputs: Sequence[Tensor],
                        outputs: Sequence[str] = (), request_id: str = ""
                        ) -> service_pb2.ModelInferRequest:
    """One ModelInfer request: every input's raw contents, the outputs asked for (none: all)."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version,
                                            id=request_id)
    add_raw_tensors(request.inputs, request.raw_input_contents, inputs)
    for name in outputs:
        request.outputs.add().name = name
    return request


@dataclass(frozen=True)
class InferredTensors:
    """What one ModelInfer call answered: its outputs and the model version that gave them."""

    outputs: tuple[Tensor, ...]
    model_version: str


def output_tensors(response: service_pb2.ModelInferResponse) -> InferredTensors:
    """The response's outputs as tensors, each checked against its shape."""
    raws = response.raw_output_contents
    what = f"infer {response.model_name!r}"
    if len(raws) != len(response.outputs):
        raise PermanentBackendError(f"{what}: {len(response.outputs)} outputs with {len(raws)} "
                                    "raw contents")
    return _checked([(out.name, out.datatype, out.shape, raw)
                     for out, raw in zip(response.outputs, raws, strict=True)],
                    response.model_version, what)


def reply_tensors(reply: InferReply, what: str) -> InferredTensors:
    """An HTTP infer reply's outputs as tensors, each checked against its shape."""
    return _checked([(out.name, out.datatype, out.shape, out.raw) for out in reply.outputs],
                    reply.model_version, what)


def _checked(outputs: Sequence[tuple[str, str, Sequence[int], bytes]], version: str,
             what: str) -> InferredTensors:
    try:
        tensors = tuple(checked(name, datatype, shape, raw)
                        for name, datatype, shape, raw in outputs)
    except TensorError as exc:
        raise PermanentBackendError(f"{what}: {exc}") from exc
    return InferredTensors(tensors, version)


async def infer_tensors(stub: service_pb2_grpc.GRPCInferenceServiceStub,
                        request: service_pb2.ModelInferRequest,
                        timeout_s: float) -> InferredTensors:
    """One ModelInfer call; its gRPC errors as Ferry's (transient, permanent, unknown model)."""
    try:
        response = await stub.ModelInfer(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        rows = request.inputs[0].shape[0] if request.inputs and request.inputs[0].shape else 1
        raise translate(exc, f"infer {request.model_name!r} x{rows}") from exc
    return output_tensors(response)
