"""The queue envelope and output tensors as JSON."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from ferry.codec import (
    JSON,
    EnvelopeError,
    bytes_to_json,
    decode_task,
    dumps,
    encode_task,
    outputs_to_json,
    tensor_to_json,
)
from ferry.errors import FerryError
from ferry.v1.task_pb2 import Task


def as_served(value: JSON) -> JSON:
    """What a client reads: the JSON the gateway serves (Fragments and arrays serialized)."""
    return orjson.loads(dumps(value))


def full_task() -> Task:
    return Task(task_id="0123456789abcdef0123456789abcdef", model="sim", model_version="3",
                payload=b"\x00\xffpayload", content_type="image/png",
                enqueued_at_ms=1_700_000_000_123, deadline_ms=1_700_000_005_000, priority=2,
                client_id="client-7", trace_context={"traceparent": "00-abc-def-01"})


# --- envelope -------------------------------------------------------------------------------------


def test_encode_decode_round_trip() -> None:
    task = full_task()
    data = encode_task(task)
    assert isinstance(data, bytes)
    decoded = decode_task(data)
    assert decoded == task
    assert decoded.task_id == "0123456789abcdef0123456789abcdef"
    assert decoded.payload == b"\x00\xffpayload"
    assert decoded.enqueued_at_ms == 1_700_000_000_123
    assert dict(decoded.trace_context) == {"traceparent": "00-abc-def-01"}


def test_round_trip_with_only_required_fields() -> None:
    decoded = decode_task(encode_task(Task(task_id="t", model="m")))
    assert decoded.task_id == "t"
    assert decoded.model == "m"
    assert decoded.payload == b""
    assert decoded.deadline_ms == 0


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"garbage bytes", b"\x0a\x05ab"])
def test_garbage_bytes_raise_envelope_error(data: bytes) -> None:
    with pytest.raises(EnvelopeError, match="undecodable task envelope"):
        decode_task(data)


def test_envelope_error_is_a_ferry_error() -> None:
    assert issubclass(EnvelopeError, FerryError)


@pytest.mark.parametrize(
    "task",
    [Task(model="sim", payload=b"x"), Task(task_id="t", payload=b"x"), Task()],
)
def test_envelope_without_task_id_or_model_raises(task: Task) -> None:
    with pytest.raises(EnvelopeError, match="without task_id or model"):
        decode_task(encode_task(task))


def test_empty_bytes_raise_envelope_error() -> None:
    with pytest.raises(EnvelopeError, match="without task_id or model"):
        decode_task(b"")


# --- bytes_to_json --------------------------------------------------------------------------------


def test_json_is_embedded_as_it_is() -> None:
    raw = b'{"b": 1,  "a": [1e2, 123456789012345678901234567890]}'
    assert dumps(bytes_to_json(raw)) == raw  # byte for byte: order, spacing, big integers


def test_json_values_are_embedded() -> None:
    assert as_served(bytes_to_json(b'{"sha256": "ab", "length": 3}')) == {"sha256": "ab",
                                                                          "length": 3}
    assert as_served(bytes_to_json(b"[1, 2.5, null]")) == [1, 2.5, None]
    assert as_served(bytes_to_json(b"42")) == 42
    assert as_served(bytes_to_json(b"true")) is True


def test_text_is_returned_as_str() -> None:
    assert as_served(bytes_to_json(b"hello world")) == "hello world"
    assert as_served(bytes_to_json("caf\u00e9".encode())) == "caf\u00e9"
    assert as_served(bytes_to_json(b"")) == ""


def test_non_utf8_is_base64() -> None:
    assert as_served(bytes_to_json(b"\xff\xfe\x00")) == {"base64": "//4A"}
    assert as_served(bytes_to_json(b"\x89PNG\r\n\x1a\n")) == {"base64": "iVBORw0KGgo="}


# --- tensor_to_json -------------------------------------------------------------------------------


def test_bytes_row_with_one_element_is_that_element() -> None:
    row = np.array([b'{"label": "safe"}'], dtype=np.object_)
    assert as_served(tensor_to_json(row)) == {"label": "safe"}


def test_bytes_row_with_several_elements_is_a_list() -> None:
    row = np.array([b"one", b'{"n": 2}', b"\xff"], dtype=np.object_)
    assert as_served(tensor_to_json(row)) == ["one", {"n": 2}, {"base64": "/w=="}]


def test_fixed_width_bytes_and_str_rows() -> None:
    assert as_served(tensor_to_json(np.array([b"ab", b"cd"], dtype="S2"))) == ["ab", "cd"]
    assert as_served(tensor_to_json(np.array(["x"], dtype="U1"))) == "x"


def test_object_row_with_str_elements_is_encoded_as_text() -> None:
    assert as_served(tensor_to_json(np.array(["text", "7"], dtype=np.object_))) == ["text", 7]


def test_multidimensional_bytes_row_is_flattened() -> None:
    row = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=np.object_)
    assert as_served(tensor_to_json(row)) == ["a", "b", "c", "d"]


def test_numeric_row_has_shape_and_data() -> None:
    row = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert as_served(tensor_to_json(row)) == {"shape": [2, 3],
                                              "data": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]}


def test_numeric_vector_and_scalar_rows() -> None:
    assert as_served(tensor_to_json(np.array([1, 2, 3], dtype=np.int64))) == {
        "shape": [3], "data": [1, 2, 3]}
    assert as_served(tensor_to_json(np.array(0.5, dtype=np.float64))) == {"shape": [], "data": 0.5}
    assert as_served(tensor_to_json(np.array([True, False]))) == {"shape": [2],
                                                                  "data": [True, False]}


def test_outputs_to_json_keys_by_output_name() -> None:
    rows = {"OUTPUT": np.array([b'{"ok": true}'], dtype=np.object_),
            "SCORES": np.array([0.25, 0.75], dtype=np.float32)}
    assert as_served(outputs_to_json(rows)) == {"OUTPUT": {"ok": True},
                                     "SCORES": {"shape": [2], "data": [0.25, 0.75]}}


def test_non_finite_numbers_become_null() -> None:
    row = np.array([1.5, np.nan, np.inf], dtype=np.float32)
    assert as_served(tensor_to_json(row)) == {"shape": [3], "data": [1.5, None, None]}


def test_json_with_nan_is_passed_on_as_text() -> None:
    assert as_served(bytes_to_json(b'{"score": NaN}')) == '{"score": NaN}'


def test_json_with_an_overflowing_number_is_passed_on_as_text() -> None:
    assert as_served(bytes_to_json(b'{"score": 1e999}')) == '{"score": 1e999}'
    assert as_served(bytes_to_json(b'{"score": 1e300}')) == {"score": 1e300}


def test_rows_decoded_from_triton_are_lists_of_elements() -> None:
    assert as_served(tensor_to_json([b'{"ok": true}'])) == {"ok": True}
    assert as_served(tensor_to_json([b"one", b"\xff"])) == ["one", {"base64": "/w=="}]


def test_complex_numbers_become_real_imaginary_pairs() -> None:
    row = np.array([1 + 2j, complex("nan+1j")], dtype=np.complex64)
    assert as_served(tensor_to_json(row)) == {"shape": [2], "data": [[1.0, 2.0], [None, 1.0]]}


def test_non_contiguous_numeric_rows_are_served() -> None:
    row = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    assert as_served(tensor_to_json(row)) == {"shape": [3, 2], "data": [[0, 2], [4, 6], [8, 10]]}
