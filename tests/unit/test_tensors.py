"""The tensor codec, without servers: checks, concatenation and splitting by rows, JSON."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ferry.tensors import (
    Tensor,
    TensorError,
    checked,
    concat,
    flatten,
    from_json,
    numeric,
    pack_bytes,
    split,
    to_json,
    unpack_bytes,
)


def fp32(name: str, rows: list[list[float]]) -> Tensor:
    array = np.asarray(rows, dtype="<f4")
    return Tensor(name, "FP32", tuple(array.shape), array.tobytes())


def test_a_tensor_whose_bytes_match_its_shape_is_accepted() -> None:
    tensor = checked("x", "INT8", [2, 3], bytes(6))
    assert tensor.rows == 2 and tensor.elements == 6 and tensor.signature == ("x", "INT8", (3,))


@pytest.mark.parametrize(("datatype", "shape", "raw", "message"), [
    ("FP32", [1, 4], bytes(15), "takes 16 bytes, its data has 15"),
    ("FP32", [1, 4], bytes(17), "takes 16 bytes, its data has 17"),
    ("FLOAT", [1], bytes(4), "unknown datatype 'FLOAT'"),
    ("INT32", [1, -1], bytes(4), "negative dimension"),
    ("BYTES", [1, 2], pack_bytes([b"a"]), "holds 2 elements, its data 1"),
    ("BYTES", [1, 1], pack_bytes([b"abc"])[:-1], "ends inside an element"),
    ("BYTES", [1, 1], b"\x01\x00", "ends inside an element's length"),
])
def test_a_tensor_that_is_not_what_it_claims_says_what_differs(
    datatype: str, shape: list[int], raw: bytes, message: str,
) -> None:
    with pytest.raises(TensorError, match=message):
        checked("x", datatype, shape, raw)


def test_bytes_elements_round_trip_through_their_lengths() -> None:
    elements = [b"", b"hello", bytes(range(256))]
    assert unpack_bytes(pack_bytes(elements)) == elements


def test_rows_of_many_requests_concatenate_and_split_back() -> None:
    a, b = fp32("x", [[1, 2]]), fp32("x", [[3, 4], [5, 6], [7, 8]])
    batch = concat([a, b])
    assert batch.shape == (4, 2)
    assert numeric(batch).tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert split(batch, [1, 3]) == [a, b]


def test_bytes_tensors_split_by_rows_of_several_elements() -> None:
    rows = [[b"a", b"bb"], [b"", b"cccc"], [b"d", b"e"]]
    batch = Tensor("s", "BYTES", (3, 2), pack_bytes([e for row in rows for e in row]))
    parts = split(batch, [2, 1])
    assert [p.shape for p in parts] == [(2, 2), (1, 2)]
    assert unpack_bytes(parts[0].raw) == [b"a", b"bb", b"", b"cccc"]
    assert unpack_bytes(parts[1].raw) == [b"d", b"e"]


def test_tensors_of_other_shapes_or_datatypes_are_never_batched_together() -> None:
    with pytest.raises(TensorError, match="cannot batch"):
        concat([fp32("x", [[1, 2]]), fp32("x", [[1, 2, 3]])])
    with pytest.raises(TensorError, match="cannot batch"):
        concat([fp32("x", [[1]]), Tensor("x", "FP64", (1, 1), bytes(8))])


def test_a_split_must_account_for_every_row() -> None:
    with pytest.raises(TensorError, match="has 2 rows for 3 requested"):
        split(fp32("y", [[1], [2]]), [1, 2])


@pytest.mark.parametrize(("datatype", "data", "expected"), [
    ("FP32", [[1.5, 2.0], [3.0, 4.0]], [1.5, 2.0, 3.0, 4.0]),
    ("INT64", [1, -2, 3, 4], [1, -2, 3, 4]),
    ("UINT8", [0, 255, 1, 2], [0, 255, 1, 2]),
    ("BOOL", [True, False, True, True], [True, False, True, True]),
    ("FP16", [0.5, 1.0, -2.0, 65504.0], [0.5, 1.0, -2.0, 65504.0]),
    ("BF16", [1.0, -2.5, 0.0, 256.0], [1.0, -2.5, 0.0, 256.0]),
    ("BYTES", ["a", "bé", "", "d"], ["a", "bé", "", "d"]),
])
def test_json_data_round_trips_for_each_datatype(
    datatype: str, data: list[object], expected: list[object],
) -> None:
    tensor = from_json("x", datatype, [2, 2], data)
    assert to_json(tensor) == expected


def test_bf16_rounds_to_nearest_even() -> None:
    tensor = from_json("x", "BF16", [1], [1.00390625])  # halfway between 1.0 and 1.0078125
    assert to_json(tensor) == [1.0]


@pytest.mark.parametrize(("datatype", "data", "message"), [
    ("FP32", [1.0, 2.0, 3.0], "holds 4 elements, its data 3"),
    ("INT32", [1, 2, 3, 4.5], "must be numbers"),
    ("INT32", [1, 2, 3, True], "must be numbers"),
    ("BOOL", [1, 0, 1, 0], "must be booleans"),
    ("BYTES", ["a", "b", "c", 4], "must be a string"),
    ("UINT8", [1, 2, 3, 256], "UINT8 holds 0 to 255, the data has 256"),
    ("INT8", [-129, 2, 3, 4], "INT8 holds -128 to 127, the data has -129"),
    ("FP16", [1.0, 2.0, 3.0, 70000.0], "FP16 holds"),
    ("COMPLEX", [1, 2, 3, 4], "unknown datatype"),
])
def test_json_data_that_does_not_fit_says_so(
    datatype: str, data: list[object], message: str,
) -> None:
    with pytest.raises(TensorError, match=message):
        from_json("x", datatype, [2, 2], data)


def test_nan_and_infinities_are_floats_own_values_and_the_range_still_applies() -> None:
    tensor = from_json("x", "FP32", [3], [math.nan, math.inf, -math.inf])
    assert tensor.raw == np.array([math.nan, math.inf, -math.inf], dtype="<f4").tobytes()
    with pytest.raises(TensorError, match="FP32 holds"):
        from_json("x", "FP32", [2], [math.nan, 1e39])


def test_nested_and_flat_data_read_alike() -> None:
    assert flatten([[1, [2]], [3, 4]]) == [1, 2, 3, 4]
    assert flatten(5) == [5]
