"""Triton's gRPC messages (``inference.GRPCInferenceService``) as Ferry's tensors and back: pure
code, no I/O.

A ``ModelInferRequest`` carries each input's contents either typed (``contents``: the field of
its datatype's family; FP16 and BF16 have none) or raw (``raw_input_contents``, one entry per
input, in order; then for every input, as Triton requires). Its parameters are typed values;
``respond_async`` (a bool) is Ferry's own, asking for the task's id at once instead of the
outputs. A ``ModelInferResponse`` carries every output in ``raw_output_contents``, as Triton
answers. Discovery replies are built from the JSON the REST routes give (Triton's own replies,
through ``ferry.triton.http_json``), so both protocols tell the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

from ferry.oip.request import InferRequest, RequestedOutput
from ferry.tensors import Tensor, TensorError, checked, from_json
from ferry.triton.oip import add_raw_tensors

ASYNC_PARAMETER = "respond_async"
# The InferTensorContents field that holds each datatype's typed values.
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


class GrpcRequestError(TensorError):
    """A request whose message cannot be read as tensors (INVALID_ARGUMENT)."""


def parameter_values(parameters: Mapping[str, service_pb2.InferParameter]) -> dict[str, Any]:
    """Typed parameters as plain values (the one each ``InferParameter`` holds)."""
    values: dict[str, Any] = {}
    for name, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is None:
            raise GrpcRequestError(f"parameter {name!r} holds no value")
        values[name] = getattr(parameter, kind)
    return values


def infer_request(message: service_pb2.ModelInferRequest) -> tuple[InferRequest, bool]:
    """The request in a ``ModelInferRequest``, and whether it asks to be answered at once
    (``respond_async``); a ``TensorError`` says what cannot be read."""
    parameters = parameter_values(message.parameters)
    asynchronous = parameters.pop(ASYNC_PARAMETER, False)
    if not isinstance(asynchronous, bool):
        raise GrpcRequestError(f"parameter {ASYNC_PARAMETER!r} must be a bool, is "
                               f"{asynchronous!r}")
    if not message.inputs:
        raise GrpcRequestError("the request must list its inputs")
    outputs = tuple(RequestedOutput(output.name) for output in message.outputs)
    for output in message.outputs:
        _no_shared_memory(output.name, output.parameters)
    return InferRequest(_inputs(message), outputs, message.id, parameters), asynchronous


def _inputs(message: service_pb2.ModelInferRequest) -> tuple[Tensor, ...]:
    raws = message.raw_input_contents
    if raws and len(raws) != len(message.inputs):
        raise GrpcRequestError(f"raw_input_contents has {len(raws)} entries for "
                               f"{len(message.inputs)} inputs: it must have one per input")
    tensors = []
    for index, entry in enumerate(message.inputs):
        _no_shared_memory(entry.name, entry.parameters)
        if not raws:
            tensors.append(_typed(entry))
            continue
        if entry.HasField("contents"):
            raise GrpcRequestError(f"input {entry.name!r}: contents given both typed and in "
                                   "raw_input_contents")
        tensors.append(checked(entry.name, entry.datatype, entry.shape, raws[index]))
    return tuple(tensors)


def _no_shared_memory(name: str, parameters: Mapping[str, service_pb2.InferParameter]) -> None:
    if any(key.startswith("shared_memory") for key in parameters):
        raise GrpcRequestError(f"tensor {name!r}: shared memory is not supported (a remote "
                               "front end cannot map a client's memory)")


def _typed(entry: service_pb2.ModelInferRequest.InferInputTensor) -> Tensor:
    """An input from its typed contents, read and checked as the same values in JSON are
    (``ferry.tensors.from_json``: element count, each value's kind and range)."""
    field = CONTENTS_FIELD.get(entry.datatype)
    if field is None:
        if entry.datatype in ("FP16", "BF16"):
            raise GrpcRequestError(f"input {entry.name!r}: {entry.datatype} has no typed "
                                   "contents; send it in raw_input_contents")
        raise GrpcRequestError(f"input {entry.name!r}: unknown datatype {entry.datatype!r}")
    return from_json(entry.name, entry.datatype, entry.shape,
                     list(getattr(entry.contents, field)))


def infer_response(model: str, version: str, outputs: Sequence[Tensor],
                   request_id: str = "") -> service_pb2.ModelInferResponse:
    """The response Triton gives: every output's contents in ``raw_output_contents``."""
    response = service_pb2.ModelInferResponse(model_name=model, model_version=version,
                                              id=request_id)
    add_raw_tensors(response.outputs, response.raw_output_contents, outputs)
    return response


def accepted_response(model: str, version: str, request_id: str, task_id: str,
                      status_url: str) -> service_pb2.ModelInferResponse:
    """The answer to a ``respond_async`` request: no outputs, the task's id and where its
    result will be, as string parameters."""
    response = service_pb2.ModelInferResponse(model_name=model, model_version=version,
                                              id=request_id)
    response.parameters["task_id"].string_param = task_id
    response.parameters["status_url"].string_param = status_url
    return response


def message_from_json(document: Mapping[str, Any], message: Message) -> Message:
    """``message`` filled from Triton's JSON for it (what the REST routes answer)."""
    try:
        ParseDict(dict(document), message, ignore_unknown_fields=True)
    except ParseError as exc:  # Triton's own reply: it always parses
        raise TensorError(f"Triton's reply does not fit {message.DESCRIPTOR.name}: {exc}"
                          ) from exc
    return message
