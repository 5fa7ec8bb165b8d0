"""The OIP REST infer bodies against tritonclient's own code, a client nobody here wrote: the
parser reads exactly what ``generate_request_body`` produces, JSON and binary, and
``parse_response_body`` reads exactly what the encoder produces. No servers."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput

from ferry.oip.request import (
    EncodedResponse,
    InferRequest,
    InferRequestError,
    RequestedOutput,
    encode_infer_response,
    header_length,
    parse_infer_request,
)
from ferry.tensors import Tensor, TensorError, checked, numeric, pack_bytes, unpack_bytes

ARRAYS: dict[str, npt.NDArray[Any]] = {
    "FP32": np.array([[0.1, -2.5, 3e38], [1.0, 0.0, -0.0]], dtype=np.float32),
    "INT8": np.array([[-128, 0, 127], [1, 2, 3]], dtype=np.int8),
    "BYTES": np.array([[b"a", b"", "bé".encode()], [b"x" * 300, b"y", b"z"]], dtype=np.object_),
    "BOOL": np.array([[True, False, True], [False, False, True]], dtype=np.bool_),
    "FP16": np.array([[0.5, -1.0, 65504.0], [0.1, 2.0, 3.0]], dtype=np.float16),
}


def infer_input(name: str, datatype: str, binary: bool) -> InferInput:
    array = ARRAYS[datatype]
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def raw(datatype: str) -> bytes:
    array = ARRAYS[datatype]
    if datatype == "BYTES":
        return pack_bytes([bytes(e) for e in array.flatten()])
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def generated(inputs: list[InferInput], **kwargs: Any) -> InferRequest:
    body, length = InferenceServerClient.generate_request_body(inputs, **kwargs)
    return parse_infer_request(body, length)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", list(ARRAYS))
def test_the_parser_reads_what_tritonclient_sends(datatype: str, binary: bool) -> None:
    request = generated([infer_input("x", datatype, binary)], request_id="r-1")
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 3))
    assert tensor.raw == raw(datatype)
    assert checked(tensor.name, tensor.datatype, tensor.shape, tensor.raw) == tensor
    assert request.id == "r-1"


def test_binary_and_json_inputs_mix_and_take_the_tail_in_order() -> None:
    inputs = [infer_input("a", "BYTES", True), infer_input("b", "FP32", False),
              infer_input("c", "INT8", True), infer_input("d", "FP16", True)]
    outputs = [InferRequestedOutput("y", binary_data=False), InferRequestedOutput("z")]
    request = generated(inputs, outputs=outputs, parameters={"custom": 7})
    assert [t.raw for t in request.inputs] == [raw("BYTES"), raw("FP32"), raw("INT8"), raw("FP16")]
    assert request.outputs == (RequestedOutput("y", False), RequestedOutput("z", True))
    assert request.output_names == ("y", "z") and request.parameters == {"custom": 7}
    assert not request.binary("y") and request.binary("z")


def test_no_requested_outputs_means_every_output_in_binary_as_tritonclient_asks() -> None:
    request = generated([infer_input("x", "FP32", False)])
    assert request.outputs == () and request.binary("anything")
    body = b'{"inputs":[{"name":"x","datatype":"INT8","shape":[1],"data":[1]}]}'
    assert not parse_infer_request(body).binary("anything")


def binary_body() -> tuple[bytes, int]:
    body, length = InferenceServerClient.generate_request_body(
        [infer_input("a", "FP32", True), infer_input("b", "INT8", True)])
    assert length is not None
    return body, length


def test_a_truncated_binary_body_says_so() -> None:
    body, length = binary_body()
    with pytest.raises(InferRequestError, match=r"input 'b': binary_data_size 6 at byte 24 .* "
                                                r"truncated"):
        parse_infer_request(body[:-1], length)


def test_bytes_past_the_binary_data_are_refused() -> None:
    body, length = binary_body()
    with pytest.raises(InferRequestError, match="1 bytes after the binary data"):
        parse_infer_request(body + b"!", length)


def test_a_header_length_past_the_body_says_so() -> None:
    body, _ = binary_body()
    with pytest.raises(InferRequestError, match=f"{len(body) + 1} is past the end of the body"):
        parse_infer_request(body, len(body) + 1)


@pytest.mark.parametrize(("header", "message"), [
    (b'{"inputs": [', "not valid JSON"),
    (b"[1]", "must be a JSON object"),
    (b"{}", "must list its inputs"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}',
     "input 'x' has neither data nor binary_data_size"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1], '
     b'"parameters": {"binary_data_size": 0}}]}', "input 'x' has both data and binary_data_size"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], '
     b'"parameters": {"binary_data_size": -1}}]}', "binary_data_size must be a byte count"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], '
     b'"parameters": {"shared_memory_region": "r"}}]}', "shared memory is not supported"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [-1], "data": [1]}]}',
     "shape must be a list of sizes"),
    (b'{"inputs": [{"datatype": "INT8", "shape": [1], "data": [1]}]}', "needs a 'name' string"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [2], "data": [1]}]}',
     "holds 2 elements, its data 1"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}], '
     b'"outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]}',
     "binary_data must be true or false"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}], '
     b'"outputs": [{"name": "y", "parameters": {"classification": 3}}]}',
     "classification is not supported"),
    (b'{"id": 5, "inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}]}',
     "id must be a string"),
])
def test_a_body_that_cannot_be_read_says_why(header: bytes, message: str) -> None:
    with pytest.raises(TensorError, match=message):  # InferRequestError, or the tensor's own
        parse_infer_request(header)


def test_the_header_length_header_must_be_a_count() -> None:
    assert header_length(None) is None and header_length("12") == 12
    with pytest.raises(InferRequestError, match="must be a byte count"):
        header_length("-3")


def outputs() -> list[Tensor]:
    return [Tensor(f"out_{d}", d, (2, 3), raw(d)) for d in ARRAYS]


def read_back(encoded: EncodedResponse) -> Any:
    return InferenceServerClient.parse_response_body(encoded.body,
                                                     header_length=encoded.header_length)


def expected(datatype: str, binary: bool) -> npt.NDArray[Any]:
    array = ARRAYS[datatype]
    if datatype == "BYTES" and not binary:  # JSON carries text: tritonclient gives str
        return np.array([[bytes(e).decode() for e in row] for row in array], dtype=np.object_)
    return array


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_reads_what_the_encoder_answers(binary: bool) -> None:
    names = {t.name for t in outputs()} if binary else set()
    encoded = encode_infer_response("m", "1", outputs(), request_id="r-9", binary=names)
    assert (encoded.header_length is not None) == binary
    result = read_back(encoded)
    for datatype in ARRAYS:
        answer = result.as_numpy(f"out_{datatype}")
        assert answer.shape == (2, 3) and answer.dtype == expected(datatype, binary).dtype
        assert answer.tolist() == expected(datatype, binary).tolist()
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("m", "1",
                                                                                  "r-9")


def test_json_data_is_flat_and_binary_outputs_name_their_size() -> None:
    fp32 = Tensor("y", "FP32", (1, 2), np.array([[1.5, 2.0]], dtype="<f4").tobytes())
    text = Tensor("t", "BYTES", (1, 1), pack_bytes([b"ok"]))
    encoded = encode_infer_response("m", "2", [fp32, text], binary={"t"})
    assert encoded.header_length is not None
    header = orjson.loads(encoded.body[:encoded.header_length])
    assert header == {"model_name": "m", "model_version": "2", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]},
        {"name": "t", "datatype": "BYTES", "shape": [1, 1],
         "parameters": {"binary_data_size": 6}}]}
    assert encoded.body[encoded.header_length:] == pack_bytes([b"ok"])


def test_bytes_that_are_not_text_go_in_binary_even_when_json_was_asked() -> None:
    blob = Tensor("b", "BYTES", (1, 1), pack_bytes([b"\xff\x00"]))
    encoded = encode_infer_response("m", "1", [blob])
    assert encoded.header_length is not None
    assert read_back(encoded).as_numpy("b").tolist() == [[b"\xff\x00"]]


def test_a_request_read_from_json_encodes_back_to_the_same_numbers() -> None:
    request = generated([infer_input("x", "FP16", False)])
    (tensor,) = request.inputs
    assert numeric(tensor).tolist() == ARRAYS["FP16"].flatten().tolist()
    assert unpack_bytes(generated([infer_input("s", "BYTES", False)]).inputs[0].raw) == [
        bytes(e) for e in ARRAYS["BYTES"].flatten()]


def test_the_header_lists_its_fields_in_tritons_order() -> None:
    blob = Tensor("b", "UINT8", (1, 2), b"\x01\x02")
    encoded = encode_infer_response("m", "1", [blob], request_id="r-1", binary={"b"})
    assert encoded.body == (b'{"id":"r-1","model_name":"m","model_version":"1","outputs":[{"name":'
                            b'"b","datatype":"UINT8","shape":[1,2],"parameters":{"binary_data_size'
                            b'":2}}]}\x01\x02')


def test_nan_and_infinities_travel_in_json_as_triton_writes_and_reads_them() -> None:
    values = np.array([[np.nan, np.inf, -np.inf, 1.5]], dtype=np.float32)
    tensor = InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(values, binary_data=False)  # tritonclient writes NaN, Infinity
    (read,) = generated([tensor]).inputs
    assert read.raw == values.tobytes()
    encoded = encode_infer_response("m", "1", [read])
    assert b'"data":[NaN,Infinity,-Infinity,1.5]' in encoded.body  # as Triton answers
    assert read_back(encoded).as_numpy("x").tobytes() == values.tobytes()
