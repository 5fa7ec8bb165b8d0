"""Wire formats: the queue envelope, and a model's output tensors as JSON for the client."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
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
    """A BYTES element: JSON is embedded as JSON, UTF-8 as text, anything else as base64."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode("ascii")}
    try:
        # NaN and Infinity (also 1e999, which overflows) are not JSON: pass such text on as text.
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except ValueError:
        return text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal} overflows")
    return value


def tensor_to_json(row: npt.NDArray[Any]) -> JSON:
    """One request's slice of an output tensor (batch dimension removed)."""
    if row.dtype == np.object_ or row.dtype.kind in ("S", "U"):
        items = [bytes_to_json(v if isinstance(v, bytes) else str(v).encode())
                 for v in row.reshape(-1)]
        return items[0] if len(items) == 1 else items
    if row.dtype.kind in ("f", "c"):
        finite = np.isfinite(row)
        if not finite.all():  # JSON has no NaN or Infinity: they become null
            cleaned = row.astype(np.object_)
            cleaned[~finite] = None
            return {"shape": list(row.shape), "data": cleaned.tolist()}
    return {"shape": list(row.shape), "data": row.tolist()}


def outputs_to_json(rows: Mapping[str, npt.NDArray[Any]]) -> dict[str, JSON]:
    """Every output of one request, keyed by output name."""
    return {name: tensor_to_json(row) for name, row in rows.items()}
