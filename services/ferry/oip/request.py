"""The Open Inference Protocol's REST infer request and response bodies, as Triton's HTTP
endpoint reads and writes them: pure code, no I/O.

A request body is JSON, or, with the binary tensor extension, a JSON header of
``Inference-Header-Content-Length`` bytes followed by the raw contents of every input whose
``parameters.binary_data_size`` says how many bytes it takes, in the order the inputs are listed.
A response is JSON with each output's ``data`` flat, or, for an output asked for in binary
(``binary_data`` per output, else the request's ``binary_data_output``), its
``parameters.binary_data_size`` and its raw contents after the header. A body that cannot be
read is an ``InferRequestError`` whose message says why; whether its tensors fit the model is
``ferry.oip.spec``'s to check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ferry.tensors import Tensor, TensorError, finite, from_json, to_json

HEADER_LENGTH = "inference-header-content-length"
_NO_NUMBER = {"nan": orjson.Fragment(b"NaN"), "inf": orjson.Fragment(b"Infinity"),
              "-inf": orjson.Fragment(b"-Infinity")}  # Triton's words for floats JSON lacks
_SHARED_MEMORY = "shared_memory_region"


class InferRequestError(TensorError):
    """A body that is not a readable infer request (a 400, as Triton answers it)."""


@dataclass(frozen=True)
class RequestedOutput:
    """An output the client asked for; ``binary`` None: as the request's binary_data_output."""

    name: str
    binary: bool | None = None


@dataclass(frozen=True)
class InferRequest:
    """An infer request as read from its body; its tensors are not yet checked against a model."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[RequestedOutput, ...] = ()  # empty: every output
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(output.name for output in self.outputs)

    def binary(self, output: str) -> bool:
        """Whether the response carries this output's contents in binary."""
        for requested in self.outputs:
            if requested.name == output and requested.binary is not None:
                return requested.binary
        return bool(self.parameters.get("binary_data_output", False))


def header_length(value: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header's value (None: the body is all JSON)."""
    if value is None:
        return None
    if not value.strip().isdigit():
        raise InferRequestError(f"Inference-Header-Content-Length must be a byte count, is "
                                f"{value!r}")
    return int(value)


def parse_infer_request(body: bytes, json_length: int | None = None) -> InferRequest:
    """The request in a body, its JSON header ``json_length`` bytes long (None: all of it)."""
    if json_length is not None and json_length > len(body):
        raise InferRequestError(f"Inference-Header-Content-Length {json_length} is past the end "
                                f"of the body ({len(body)} bytes)")
    split = len(body) if json_length is None else json_length
    return _request(_json_object(body[:split]), memoryview(body)[split:])


def read_infer_request(document: Mapping[str, Any]) -> InferRequest:
    """The request a JSON object already parsed describes (all JSON: no binary data follows
    it), as ``/v1/inference``'s tensor form carries it."""
    return _request(document, memoryview(b""))


def _request(header: Mapping[str, Any], tail: memoryview) -> InferRequest:
    """The request in a JSON header, its inputs' binary data taken from ``tail`` in order."""
    inputs, used = _inputs(header.get("inputs"), tail)
    if used != len(tail):
        raise InferRequestError(f"the body has {len(tail) - used} bytes after the binary data "
                                f"its inputs name ({used} bytes)")
    parameters = _mapping(header.get("parameters"), "the request's parameters")
    binary = parameters.get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise InferRequestError(f"binary_data_output must be true or false, is {binary!r}")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InferRequestError(f"the request's id must be a string, is {request_id!r}")
    return InferRequest(inputs, _outputs(header.get("outputs")), request_id, parameters)


def _json_object(header: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        value = _with_no_numbers(header, exc)
    if not isinstance(value, dict):
        raise InferRequestError("the request must be a JSON object")
    return value


def _with_no_numbers(header: bytes, error: orjson.JSONDecodeError) -> Any:
    """JSON with NaN, Infinity or -Infinity, which Triton reads and tritonclient writes for
    floats JSON has no number for (orjson reads none of them)."""
    try:
        return json.loads(header)
    except ValueError:
        raise InferRequestError(f"the request is not valid JSON: {error}") from error


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InferRequestError(f"{what} must be a JSON object, is {value!r}")
    return value


def _inputs(value: Any, tail: memoryview) -> tuple[tuple[Tensor, ...], int]:
    """The inputs, taking their binary data from ``tail`` in order; and the bytes taken."""
    if not isinstance(value, list) or not value:
        raise InferRequestError("the request must list its inputs ('inputs': [...])")
    inputs: list[Tensor] = []
    used = 0
    for item in value:
        tensor, size = _input(item, tail, used)
        inputs.append(tensor)
        used += size
    return tuple(inputs), used


def _input(item: Any, tail: memoryview, offset: int) -> tuple[Tensor, int]:
    """One input and how many bytes of the binary tail it took."""
    if not isinstance(item, dict):
        raise InferRequestError(f"an input must be a JSON object, is {item!r}")
    name, datatype = _string(item, "name", "an input"), _string(item, "datatype", "an input")
    shape = _shape(name, item.get("shape"))
    parameters = _mapping(item.get("parameters"), f"input {name!r}'s parameters")
    if _SHARED_MEMORY in parameters:
        raise InferRequestError(f"input {name!r}: shared memory is not supported")
    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in item:
            raise InferRequestError(f"input {name!r} has neither data nor binary_data_size")
        return from_json(name, datatype, shape, item["data"]), 0
    if "data" in item:
        raise InferRequestError(f"input {name!r} has both data and binary_data_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InferRequestError(f"input {name!r}: binary_data_size must be a byte count, is "
                                f"{size!r}")
    if offset + size > len(tail):
        raise InferRequestError(f"input {name!r}: binary_data_size {size} at byte {offset} of "
                                f"the binary data is past its end ({len(tail)} bytes): the body "
                                "is truncated")
    return Tensor(name, datatype, shape, bytes(tail[offset:offset + size])), size


def _string(item: Mapping[str, Any], key: str, what: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InferRequestError(f"{what} needs a '{key}' string, has {value!r}")
    return value


def _shape(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in value):
        raise InferRequestError(f"input {name!r}: shape must be a list of sizes (integers, 0 "
                                f"or more), is {value!r}")
    return tuple(value)


def _outputs(value: Any) -> tuple[RequestedOutput, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InferRequestError(f"'outputs' must be a list, is {value!r}")
    return tuple(_output(item) for item in value)


def _output(item: Any) -> RequestedOutput:
    if not isinstance(item, dict):
        raise InferRequestError(f"a requested output must be a JSON object, is {item!r}")
    name = _string(item, "name", "a requested output")
    parameters = _mapping(item.get("parameters"), f"output {name!r}'s parameters")
    unsupported = sorted({_SHARED_MEMORY, "classification"} & parameters.keys())
    if unsupported:
        raise InferRequestError(f"output {name!r}: {unsupported[0]} is not supported")
    binary = parameters.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise InferRequestError(f"output {name!r}: binary_data must be true or false, is "
                                f"{binary!r}")
    return RequestedOutput(name, binary)


@dataclass(frozen=True)
class EncodedResponse:
    """A response body, and its JSON header's length when binary data follows it (the value
    of the ``Inference-Header-Content-Length`` response header; None: all JSON)."""

    body: bytes
    header_length: int | None


def encode_infer_response(model: str, version: str, outputs: Sequence[Tensor], *,
                          request_id: str = "", binary: Collection[str] = ()
                          ) -> EncodedResponse:
    """The response body for ``outputs``; those named in ``binary`` (and BYTES outputs that are
    not UTF-8 text, which JSON cannot carry) go as binary data after the JSON header."""
    described: list[dict[str, Any]] = []
    tail: list[bytes] = []
    for tensor in outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                                 "shape": list(tensor.shape)}
        data = None if tensor.name in binary else _json_data(tensor)
        if data is None:
            entry["parameters"] = {"binary_data_size": len(tensor.raw)}
            tail.append(tensor.raw)
        else:
            entry["data"] = data
        described.append(entry)
    # Triton's order of fields: a body with binary outputs is then byte for byte Triton's
    head: dict[str, Any] = {"id": request_id} if request_id else {}
    head.update(model_name=model, model_version=version, outputs=described)
    header = orjson.dumps(head)
    if not tail:
        return EncodedResponse(header, None)
    return EncodedResponse(b"".join([header, *tail]), len(header))


def _json_data(tensor: Tensor) -> list[Any] | None:
    """The output's flat JSON data, NaN and infinities as Triton writes them; or None where
    JSON cannot carry it (bytes not UTF-8)."""
    data = to_json(tensor)
    if tensor.datatype == "BYTES" and any(isinstance(e, bytes) for e in data):
        return None
    if not finite(tensor):
        return [v if math.isfinite(v) else _NO_NUMBER[repr(v)] for v in data]
    return data
