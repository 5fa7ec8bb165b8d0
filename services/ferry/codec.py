"""Wire formats: the queue envelope, and a model's output tensors as JSON for the client."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from google.protobuf.message import DecodeError

from ferry.errors import FerryError
from ferry.v1.task_pb2 import Task

JSON = Any


class EnvelopeError(FerryError):
    """A stream entry that does not hold a valid task envelope."""


def encode_task(task: Task) -> bytes:
    return task.SerializeToString()


def decode_task(data: bytes) -> Task:
    task = Task()
    try:
        task.ParseFromString(data)
    except DecodeError as exc:
        raise EnvelopeError(f"undecodable task envelope: {exc}") from exc
    if not task.task_id or not task.model:
        raise EnvelopeError("task envelope without task_id or model")
    return task


def bytes_to_json(value: bytes) -> JSON:
    """A BYTES element: JSON is embedded as it is, UTF-8 as text, anything else as base64.

    Valid JSON (RFC 8259: no NaN or Infinity, no number that overflows a double) is passed on
    byte for byte, as an ``orjson.Fragment``: no re-encoding, and big integers stay exact.
    Base64 is ``{"base64": ...}``, as docs/models.md documents it for a payload task's output (a
    tensor task's record writes ``{"b64": ...}``, ``oip/answer.py``: both are public).
    """
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    return orjson.Fragment(value)


# dtypes orjson serializes straight from the array (non-finite floats become null)
_NUMPY_NATIVE = frozenset("biuf")


def tensor_to_json(row: npt.NDArray[Any] | Sequence[bytes]) -> JSON:
    """One request's slice of an output tensor (batch dimension removed).

    BYTES rows (a numpy object/bytes array, or the list of elements the Triton adapter decodes)
    become their element's JSON, or a list of them; numeric rows ``{"shape", "data"}``.
    """
    if not isinstance(row, np.ndarray):
        items = [bytes_to_json(v) for v in row]
        return items[0] if len(items) == 1 else items
    if row.dtype == np.object_ or row.dtype.kind in ("S", "U"):
        items = [bytes_to_json(v if isinstance(v, bytes) else str(v).encode())
                 for v in row.reshape(-1)]
        return items[0] if len(items) == 1 else items
    if row.dtype.kind in _NUMPY_NATIVE and row.ndim > 0:
        return {"shape": list(row.shape), "data": np.ascontiguousarray(row)}
    return {"shape": list(row.shape), "data": _finite(row.tolist())}


def _finite(value: Any) -> Any:
    """JSON has no NaN or Infinity: they become null (complex numbers become [real, imag])."""
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, complex):
        return [_finite(value.real), _finite(value.imag)]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def outputs_to_json(rows: Mapping[str, Any]) -> dict[str, JSON]:
    """Every output of one request, keyed by output name."""
    return {name: tensor_to_json(row) for name, row in rows.items()}


def dumps(value: JSON) -> bytes:
    """JSON bytes of anything the functions above return (numpy arrays, orjson Fragments)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
