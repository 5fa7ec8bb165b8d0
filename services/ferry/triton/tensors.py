"""Triton's raw tensor encodings: a batch of payloads in, per-request output rows out.

gRPC's ``raw_input_contents`` / ``raw_output_contents`` carry tensors as bytes: numeric tensors
in row-major little-endian order, BYTES tensors as a 4-byte little-endian length before each
element (``ferry.tensors`` packs and unpacks those, for the gateway and this adapter alike).
Decoding them here (instead of through numpy object arrays) keeps the batcher's cost per request
small.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt

from ferry.errors import ModelContractError, PermanentBackendError
from ferry.tensors import NUMPY_DTYPE, TensorError, unpack_bytes

Row = npt.NDArray[Any] | list[bytes]  # one request's slice of one output tensor
Rows = dict[str, Row]  # one request's outputs by name


def output_rows(name: str, datatype: str, shape: Sequence[int], raw: bytes,
                batch: int) -> list[Row]:
    """Split one batched output tensor into ``batch`` per-request rows."""
    if not shape or int(shape[0]) != batch:
        rows = int(shape[0]) if shape else 0
        raise ModelContractError(f"output {name!r} has {rows} rows for {batch} inputs")
    per_row = prod(int(d) for d in shape[1:])
    if datatype == "BYTES":
        elements = _elements(raw)
        if len(elements) != batch * per_row:
            raise PermanentBackendError(f"output {name!r}: {len(elements)} elements for shape "
                                        f"{list(shape)}")
        return [elements[i * per_row:(i + 1) * per_row] for i in range(batch)]
    array = _numeric(name, datatype, raw).reshape([int(d) for d in shape])
    return list(array)


def _elements(raw: bytes) -> list[bytes]:
    """A BYTES output's elements, read by ``ferry.tensors``' codec; cut short, the batch fails
    for good (Triton would answer the same again)."""
    try:
        return unpack_bytes(raw)
    except TensorError:
        raise PermanentBackendError("truncated BYTES tensor from Triton") from None


def _numeric(name: str, datatype: str, raw: bytes) -> npt.NDArray[Any]:
    if datatype == "BF16":  # no numpy dtype: widen to float32 (bf16 is float32's top half)
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
        return (halves << 16).view(np.float32)
    dtype = NUMPY_DTYPE.get(datatype)
    if dtype is None:
        raise PermanentBackendError(f"output {name!r} has datatype {datatype}, which Ferry "
                                    "cannot decode")
    try:
        return np.frombuffer(raw, dtype=dtype)
    except ValueError as exc:
        raise PermanentBackendError(f"output {name!r}: {exc}") from exc
