"""A tensor task's answer in its record: JSON that gives back every tensor exactly."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from ferry.codec import dumps
from ferry.oip.answer import answer_json, answer_tensors
from ferry.tensors import Tensor, TensorError, pack_bytes


def tensor(name: str, datatype: str, array: np.ndarray) -> Tensor:  # type: ignore[type-arg]
    return Tensor(name, datatype, tuple(array.shape), array.tobytes())


EXACT = [
    tensor("f32", "FP32", np.array([[0.1, -1e-30, 3.4e38]], dtype="<f4")),
    tensor("f16", "FP16", np.array([[0.1, 65504.0]], dtype="<f2")),
    tensor("f64", "FP64", np.array([[0.1, 1e300]], dtype="<f8")),
    tensor("i64", "INT64", np.array([[-(2**63), 2**63 - 1]], dtype="<i8")),
    tensor("u64", "UINT64", np.array([[2**64 - 1]], dtype="<u8")),
    tensor("b", "BOOL", np.array([[True, False]])),
    Tensor("bf16", "BF16", (1, 2), bytes([0x80, 0x3F, 0xC9, 0x40])),  # 1.0, 6.28125
    Tensor("s", "BYTES", (1, 3), pack_bytes([b"text", b"\xff\xfe", b""])),
]


def test_every_datatype_comes_back_exactly_through_the_records_json() -> None:
    stored = orjson.loads(dumps(answer_json(EXACT, "req-7")))
    assert stored["id"] == "req-7"
    assert answer_tensors(stored) == EXACT


def test_bytes_that_are_not_text_are_kept_as_base64() -> None:
    stored = answer_json([EXACT[-1]])
    assert stored == {"outputs": [{"name": "s", "datatype": "BYTES", "shape": [1, 3],
                                   "data": ["text", {"b64": "//4="}, ""]}]}


@pytest.mark.parametrize("answer", [
    {}, {"outputs": 3}, {"outputs": [1]}, {"outputs": [{"name": "x"}]},
    {"outputs": [{"name": "s", "datatype": "BYTES", "shape": [1], "data": [7]}]},
    {"outputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0]}]},
])
def test_an_answer_this_module_did_not_write_is_refused(answer: dict[str, object]) -> None:
    with pytest.raises(TensorError):
        answer_tensors(answer)


def test_floats_json_has_no_number_for_come_back_bit_for_bit() -> None:
    nan_bits = np.array([0x7FC00001, 0xFFC00000], dtype="<u4").view("<f4")  # a payload, -NaN
    floats = [
        tensor("f32", "FP32", np.array([[np.inf, 1.0, *nan_bits]], dtype="<f4")),
        tensor("f16", "FP16", np.array([[-np.inf, 65504.0]], dtype="<f2")),
        tensor("f64", "FP64", np.array([[np.nan, -0.0]], dtype="<f8")),
        Tensor("bf16", "BF16", (1, 2), bytes([0x80, 0x7F, 0x80, 0x3F])),  # inf, 1.0
    ]
    stored = orjson.loads(dumps(answer_json(floats)))
    assert stored["outputs"][0]["data"] == [{"b64": "AACAfw=="}, 1.0, {"b64": "AQDAfw=="},
                                            {"b64": "AADA/w=="}]
    assert answer_tensors(stored) == floats
