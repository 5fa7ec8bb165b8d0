"""A tensor task's answer as its record keeps it, and back: pure code, no I/O.

The batcher writes a tensor task's outputs into the task's record as JSON (what ``GET
/v1/result/{id}`` shows): ``{"id"?: the request's id, "outputs": [{"name", "datatype", "shape",
"data"}]}`` with ``data`` flat, as the Open Inference Protocol writes it. An element JSON has no
value for, a BYTES element that is not UTF-8 or a float that is NaN or infinite, is written
``{"b64": "<base64 of its bytes>"}`` (a NaN's bits included). Every datatype comes back from
that JSON exactly (floats are written as the doubles they widen to, which read back to the same
value), so the gateway answers any form a client asks for (JSON, binary tensors, gRPC) from the
record alone.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ferry.tensors import (
    ELEMENT_SIZE,
    Tensor,
    TensorError,
    checked,
    finite,
    from_json,
    pack_bytes,
    to_json,
)

# An element's escape, as docs/api.md and docs/oip.md document it (a payload task's output
# writes {"base64": ...} instead, codec.py, as docs/models.md says: both are public).
B64 = "b64"


def answer_json(outputs: Sequence[Tensor], request_id: str = "") -> dict[str, Any]:
    """The record's output for a tensor task that succeeded."""
    answer: dict[str, Any] = {"id": request_id} if request_id else {}
    answer["outputs"] = [tensor_json(t) for t in outputs]
    return answer


def tensor_json(tensor: Tensor) -> dict[str, Any]:
    """A tensor in the protocol's JSON form, as a record writes it: ``name``, ``datatype``,
    ``shape`` and flat ``data``, each element JSON cannot hold written ``{"b64": ...}``."""
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
            "data": _json_data(tensor)}


def _json_data(tensor: Tensor) -> list[Any]:
    data = to_json(tensor)
    if tensor.datatype == "BYTES":
        return [_b64(e) if isinstance(e, bytes) else e for e in data]
    if finite(tensor):
        return data
    size, raw = ELEMENT_SIZE[tensor.datatype], tensor.raw
    return [v if math.isfinite(v) else _b64(raw[i * size:(i + 1) * size])
            for i, v in enumerate(data)]


def _b64(element: bytes) -> dict[str, str]:
    return {B64: base64.b64encode(element).decode("ascii")}


def answer_tensors(answer: Mapping[str, Any]) -> list[Tensor]:
    """The outputs of a record's answer, as the tensors the batcher had (a ``TensorError`` for
    an answer this module did not write)."""
    outputs = answer.get("outputs")
    if not isinstance(outputs, list):
        raise TensorError("the record holds no tensor outputs")
    return [_tensor(item) for item in outputs]


def _tensor(item: Any) -> Tensor:
    if not isinstance(item, Mapping):
        raise TensorError("a recorded output is not an object")
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    data = item.get("data")
    if not (isinstance(name, str) and isinstance(datatype, str) and isinstance(shape, list)
            and isinstance(data, list)):
        raise TensorError("a recorded output lacks its name, datatype, shape or data")
    if datatype == "BYTES":
        return checked(name, datatype, shape, pack_bytes([_element(name, e) for e in data]))
    if any(isinstance(e, Mapping) for e in data):  # floats that are NaN or infinite
        return checked(name, datatype, shape, b"".join([_number(name, datatype, e)
                                                        for e in data]))
    return from_json(name, datatype, shape, data)


def _number(name: str, datatype: str, value: Any) -> bytes:
    if isinstance(value, Mapping):
        return _element(name, value)
    return from_json(name, datatype, [1], [value]).raw


def _element(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, Mapping) and isinstance(value.get(B64), str):
        return base64.b64decode(value[B64])
    raise TensorError(f"output {name!r}: a recorded element is neither its value nor base64")
