"""Tensors as the Open Inference Protocol (KServe v2) and Triton carry them: pure code, no I/O.

A tensor is a name, a datatype, a shape and its raw bytes, laid out as Triton's
``raw_input_contents`` are: numeric elements row-major and little-endian, BOOL one byte each,
BYTES each element after its 4-byte little-endian length. The first dimension of a batched
model's tensor is the batch: a request carries one or more rows, and the batcher concatenates
the rows of many requests along it, then splits every output back by rows. Both the gateway
(checking and encoding what a client sent) and the batcher (concatenating and splitting) use
this module; a wrong tensor is a ``TensorError`` whose message says what differs.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt

from ferry.errors import FerryError

_LENGTH = struct.Struct("<I")

# Each datatype's element size in bytes (BYTES: variable) and the numpy dtype that reads it.
ELEMENT_SIZE: dict[str, int] = {
    "BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8,
    "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8,
    "FP16": 2, "BF16": 2, "FP32": 4, "FP64": 8,
}
NUMPY_DTYPE: dict[str, str] = {
    "BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}
DATATYPES = frozenset([*ELEMENT_SIZE, "BYTES"])
FLOATING = frozenset({"FP16", "BF16", "FP32", "FP64"})


class TensorError(FerryError):
    """A tensor that is not what it claims or what the model takes; the message says what."""


@dataclass(frozen=True)
class Tensor:
    """One named tensor: its datatype, its shape and its raw contents."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes

    @property
    def rows(self) -> int:
        """The size of the first (batch) dimension."""
        return self.shape[0] if self.shape else 1

    @property
    def elements(self) -> int:
        return prod(self.shape)

    @property
    def signature(self) -> tuple[str, str, tuple[int, ...]]:
        """What tensors must share to be concatenated: name, datatype, non-batch shape."""
        return self.name, self.datatype, self.shape[1:]


def checked(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> Tensor:
    """The tensor, once its datatype is known, its shape has no negative dimension and its
    bytes hold exactly the elements the shape names."""
    if datatype not in DATATYPES:
        raise TensorError(f"input {name!r}: unknown datatype {datatype!r} (one of "
                          f"{', '.join(sorted(DATATYPES))})")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise TensorError(f"input {name!r}: shape {list(dims)} has a negative dimension")
    tensor = Tensor(name, datatype, dims, raw)
    _check_size(tensor)
    return tensor


def _check_size(tensor: Tensor) -> None:
    expected = tensor.elements
    if tensor.datatype == "BYTES":
        found = len(unpack_bytes(tensor.raw, tensor.name))
        if found != expected:
            raise TensorError(f"input {tensor.name!r}: shape {list(tensor.shape)} holds "
                              f"{expected} elements, its data {found}")
        return
    size = expected * ELEMENT_SIZE[tensor.datatype]
    if len(tensor.raw) != size:
        raise TensorError(f"input {tensor.name!r}: shape {list(tensor.shape)} of "
                          f"{tensor.datatype} takes {size} bytes, its data has {len(tensor.raw)}")


def pack_bytes(elements: Sequence[bytes]) -> bytes:
    """A BYTES tensor's raw contents: each element after its 4-byte little-endian length."""
    pack = _LENGTH.pack
    return b"".join([part for e in elements for part in (pack(len(e)), e)])


def unpack_bytes(raw: bytes, name: str = "") -> list[bytes]:
    """The elements of a BYTES tensor's raw contents."""
    return [raw[start:end] for start, end in _spans(raw, name)]


def _spans(raw: bytes, name: str) -> Iterator[tuple[int, int]]:
    """Where each BYTES element lies in ``raw``: (start, end)."""
    pos, end, unpack = 0, len(raw), _LENGTH.unpack_from
    while pos < end:
        if pos + 4 > end:
            raise TensorError(f"tensor {name!r}: BYTES data ends inside an element's length")
        (size,) = unpack(raw, pos)
        pos += 4
        if pos + size > end:
            raise TensorError(f"tensor {name!r}: BYTES data ends inside an element")
        yield pos, pos + size
        pos += size


def concat(tensors: Sequence[Tensor]) -> Tensor:
    """The tensors joined along their first (batch) dimension; all must share a signature."""
    first = tensors[0]
    for other in tensors[1:]:
        if other.signature != first.signature:
            raise TensorError(f"cannot batch {other.name!r} {other.datatype} "
                              f"{list(other.shape)} with {first.datatype} {list(first.shape)}")
    rows = sum(t.rows for t in tensors)
    return Tensor(first.name, first.datatype, (rows, *first.shape[1:]),
                  b"".join([t.raw for t in tensors]))


def split(tensor: Tensor, rows: Sequence[int]) -> list[Tensor]:
    """The tensor cut along its first dimension into parts of ``rows`` rows each (their sum
    must be the tensor's rows): one request's share of a batched output each."""
    if sum(rows) != tensor.rows or not tensor.shape:
        raise TensorError(f"output {tensor.name!r} has {tensor.rows} rows for "
                          f"{sum(rows)} requested")
    per_row = prod(tensor.shape[1:])
    cuts = _row_offsets(tensor, per_row)
    parts: list[Tensor] = []
    row = 0
    for count in rows:
        raw = tensor.raw[cuts[row]:cuts[row + count]]
        parts.append(Tensor(tensor.name, tensor.datatype, (count, *tensor.shape[1:]), raw))
        row += count
    return parts


def _row_offsets(tensor: Tensor, per_row: int) -> list[int]:
    """Where each row starts in the raw contents, and where the last one ends."""
    if tensor.datatype != "BYTES":
        step = per_row * ELEMENT_SIZE[tensor.datatype]
        return [row * step for row in range(tensor.rows + 1)]
    starts = [start - 4 for start, _ in _spans(tensor.raw, tensor.name)]
    if len(starts) != tensor.rows * per_row:
        raise TensorError(f"output {tensor.name!r}: {len(starts)} BYTES elements for shape "
                          f"{list(tensor.shape)}")
    return [*starts[::per_row or 1], len(tensor.raw)] if per_row else [0] * (tensor.rows + 1)


def flatten(data: Any) -> list[Any]:
    """A JSON ``data`` value as Triton takes it, nested or flat, as one flat list."""
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack: list[Any] = [iter(data)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            flat.append(item)
    return flat


_END = object()


def from_json(name: str, datatype: str, shape: Sequence[int], data: Any) -> Tensor:
    """A tensor from the OIP JSON form (``data`` nested or flat; BYTES as strings), checked."""
    values = flatten(data)
    dims = [int(d) for d in shape]
    if len(values) != prod(dims):
        raise TensorError(f"input {name!r}: shape {dims} holds {prod(dims)} elements, its data "
                          f"{len(values)}")
    if datatype == "BYTES":
        raw = pack_bytes([_element_bytes(name, v) for v in values])
    else:
        raw = _numeric_raw(name, datatype, values)
    return checked(name, datatype, dims, raw)


def _element_bytes(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    raise TensorError(f"input {name!r}: a BYTES element must be a string, got {value!r}")


def _numeric_raw(name: str, datatype: str, values: list[Any]) -> bytes:
    if datatype not in ELEMENT_SIZE:
        raise TensorError(f"input {name!r}: unknown datatype {datatype!r}")
    kind = bool if datatype == "BOOL" else (float if datatype[0] in "FB" else int)
    if any(not _fits(kind, v) for v in values):
        raise TensorError(f"input {name!r}: {datatype} data must be "
                          f"{'booleans' if kind is bool else 'numbers'}")
    _check_range(name, datatype, values)
    try:
        if datatype == "BF16":
            wide = np.asarray(values, dtype="<f4").view("<u4")
            return ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype("<u2").tobytes()
        return np.asarray(values, dtype=NUMPY_DTYPE[datatype]).tobytes()
    except (OverflowError, ValueError) as exc:
        raise TensorError(f"input {name!r}: {exc}") from exc


def _check_range(name: str, datatype: str, values: list[Any]) -> None:
    """Every value fits the datatype (numpy would wrap an integer, or round a float to inf)."""
    if not values or datatype == "BOOL":
        return
    dtype = np.dtype(NUMPY_DTYPE.get(datatype, "<f4"))
    info: Any = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    # Python numbers compared with Python numbers: numpy 2 warns when it casts 70000.0 to FP16
    bounds = (info.min, info.max) if dtype.kind in "iu" else (float(info.min), float(info.max))
    if dtype.kind == "f":  # NaN and infinity (JSON's NaN, Infinity) are a float's own values
        values = [v for v in values if isinstance(v, int) or math.isfinite(v)]
        if not values:
            return
    low, high = min(values), max(values)
    if low < bounds[0] or high > bounds[1]:
        raise TensorError(f"input {name!r}: {datatype} holds {info.min} to {info.max}, the data "
                          f"has {low if low < bounds[0] else high}")


def _fits(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (kind is float and isinstance(value, float))


def to_json(tensor: Tensor) -> list[Any]:
    """The flat ``data`` list of the OIP JSON form (BYTES as text where UTF-8)."""
    if tensor.datatype == "BYTES":
        return [_text(e) for e in unpack_bytes(tensor.raw, tensor.name)]
    return numeric(tensor).tolist()  # type: ignore[no-any-return]


def finite(tensor: Tensor) -> bool:
    """Whether every element is a number JSON can write: no NaN or infinity (always, but for
    the floating datatypes)."""
    return tensor.datatype not in FLOATING or bool(np.isfinite(numeric(tensor)).all())


def numeric(tensor: Tensor) -> npt.NDArray[Any]:
    """A numeric tensor's elements, flat (BF16 widened to float32)."""
    if tensor.datatype == "BF16":
        halves = np.frombuffer(tensor.raw, dtype="<u2").astype(np.uint32)
        return (halves << 16).view(np.float32)
    return np.frombuffer(tensor.raw, dtype=NUMPY_DTYPE[tensor.datatype])


def _text(element: bytes) -> str | bytes:
    try:
        return element.decode()
    except UnicodeDecodeError:
        return element
