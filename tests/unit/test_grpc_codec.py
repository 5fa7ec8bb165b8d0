"""Triton's gRPC infer request read as Ferry's tensors: typed contents as the same values in
JSON are read, raw contents as they are, and what cannot be read refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from ferry.oip.grpc_codec import infer_request
from ferry.tensors import TensorError, pack_bytes


def request(*inputs: tuple[str, str, list[int], str, list[object]]
            ) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="m", id="r")
    for name, datatype, shape, field, values in inputs:
        entry = message.inputs.add(name=name, datatype=datatype, shape=shape)
        getattr(entry.contents, field).extend(values)
    return message


def test_typed_contents_become_the_raw_bytes_triton_takes() -> None:
    parsed, asynchronous = infer_request(request(
        ("A", "INT8", [1, 3], "int_contents", [-128, 0, 127]),
        ("B", "BOOL", [1, 2], "bool_contents", [True, False]),
        ("C", "BYTES", [1, 2], "bytes_contents", [b"x", b"\xff"]),
        ("D", "UINT64", [1, 1], "uint64_contents", [2**64 - 1]),
        ("E", "FP32", [1, 2], "fp32_contents", [0.5, -1.5])))
    raw = {t.name: t.raw for t in parsed.inputs}
    assert raw["A"] == np.array([-128, 0, 127], "<i1").tobytes()
    assert raw["B"] == b"\x01\x00"
    assert raw["C"] == pack_bytes([b"x", b"\xff"])
    assert raw["D"] == np.array([2**64 - 1], "<u8").tobytes()
    assert raw["E"] == np.array([0.5, -1.5], "<f4").tobytes()
    assert parsed.id == "r" and not asynchronous


@pytest.mark.parametrize(("inputs", "named"), [
    ((("A", "INT8", [1, 1], "int_contents", [128]),), "INT8"),  # out of range: not wrapped
    ((("A", "INT8", [1, 2], "int_contents", [1]),), "2 elements"),
    ((("A", "FP16", [1, 1], "fp32_contents", [1.0]),), "raw_input_contents"),
    ((("A", "INT9", [1, 1], "int_contents", [1]),), "INT9"),
])
def test_typed_contents_that_cannot_be_read_are_refused(
        inputs: tuple[tuple[str, str, list[int], str, list[object]], ...], named: str) -> None:
    with pytest.raises(TensorError, match=named):
        infer_request(request(*inputs))


def test_raw_contents_go_for_every_input_and_respond_async_is_ferrys_own() -> None:
    message = request()
    for name in ("A", "B"):
        message.inputs.add(name=name, datatype="INT8", shape=[1, 1])
    message.raw_input_contents.append(b"\x01")
    with pytest.raises(TensorError, match="one per input"):
        infer_request(message)
    message.raw_input_contents.append(b"\x02")
    message.parameters["respond_async"].bool_param = True
    parsed, asynchronous = infer_request(message)
    assert [t.raw for t in parsed.inputs] == [b"\x01", b"\x02"] and asynchronous
    assert "respond_async" not in parsed.parameters
