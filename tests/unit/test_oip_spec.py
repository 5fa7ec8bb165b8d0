"""A tensor model's interface read from Triton's metadata and config, and requests checked
against it, without servers. The dicts have the shape ``MessageToDict(...,
preserving_proto_field_name=True)`` gives (int64 dims as strings)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ferry.errors import ModelContractError
from ferry.oip.spec import ModelInterface, Signature, TensorSpec, UnsupportedModelError
from ferry.tensors import Tensor, TensorError, pack_bytes


def simple(max_batch_size: int = 8, **config: Any) -> ModelInterface:
    """Triton's example "simple": INPUT0, INPUT1 FP32 [16] -> OUTPUT0 (sum), OUTPUT1 (diff)."""
    batch = ["-1"] if max_batch_size else []
    tensors = [{"name": n, "datatype": "FP32", "shape": [*batch, "16"]}
               for n in ("INPUT0", "INPUT1")]
    outputs = [{"name": n, "datatype": "FP32", "shape": [*batch, "16"]}
               for n in ("OUTPUT0", "OUTPUT1")]
    metadata = {"name": "simple", "versions": ["1"], "platform": "python",
                "inputs": tensors, "outputs": outputs}
    return ModelInterface.from_triton(metadata, {"name": "simple",
                                                 "max_batch_size": max_batch_size, **config})


def fp32(name: str, rows: int, width: int = 16) -> Tensor:
    array = np.arange(rows * width, dtype="<f4").reshape(rows, width)
    return Tensor(name, "FP32", (rows, width), array.tobytes())


def pair(rows: int) -> list[Tensor]:
    return [fp32("INPUT0", rows), fp32("INPUT1", rows)]


def test_the_interface_is_read_from_metadata_and_config() -> None:
    model = simple()
    assert model.max_batch_size == 8 and model.batched and model.versions == ("1",)
    assert model.inputs == (TensorSpec("INPUT0", "FP32", (16,)),
                            TensorSpec("INPUT1", "FP32", (16,)))
    assert [o.name for o in model.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert simple(0).inputs[0].dims == (16,) and not simple(0).batched


def test_a_variable_dimension_and_an_optional_input_are_read() -> None:
    metadata = {"name": "m",
                "inputs": [{"name": "x", "datatype": "INT8", "shape": ["-1", "-1", "3"]},
                           {"name": "mask", "datatype": "BOOL", "shape": ["-1", "3"]}],
                "outputs": [{"name": "y", "datatype": "BYTES", "shape": ["-1", "1"]}]}
    config = {"max_batch_size": 4, "input": [{"name": "mask", "optional": True}]}
    model = ModelInterface.from_triton(metadata, config)
    assert model.inputs[0].dims == (-1, 3) and model.inputs[1].optional
    request = model.check([Tensor("x", "INT8", (2, 5, 3), bytes(30))])
    assert request.rows == 2 and [t.name for t in request.inputs] == ["x"]


@pytest.mark.parametrize(("config", "message"), [
    ({"sequence_batching": {}}, "is stateful"),
    ({"sequence_batching": {"oldest": {}}}, "is stateful"),
    ({"model_transaction_policy": {"decoupled": True}}, "is decoupled"),
])
def test_stateful_and_decoupled_models_are_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        simple(**config)


def test_a_model_that_is_not_decoupled_says_so_and_is_served() -> None:
    assert simple(model_transaction_policy={}).name == "simple"
    assert simple(model_transaction_policy={"decoupled": False}).name == "simple"


def test_metadata_without_the_batch_dimension_or_with_an_unknown_datatype_is_refused() -> None:
    metadata = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": ["3"]}]}
    with pytest.raises(ModelContractError, match="without the batch dimension"):
        ModelInterface.from_triton(metadata, {"max_batch_size": 4})
    metadata = {"name": "m", "inputs": [{"name": "x", "datatype": "COMPLEX", "shape": ["3"]}]}
    with pytest.raises(ModelContractError, match="datatype 'COMPLEX'"):
        ModelInterface.from_triton(metadata, {})


def test_a_request_that_fits_comes_back_checked_in_the_model_order() -> None:
    inputs = pair(3)
    request = simple().check(inputs[::-1], ["OUTPUT1"], version="1")
    assert request.inputs == tuple(inputs) and request.rows == 3
    assert request.outputs == ("OUTPUT1",) and request.model == "simple"


@pytest.mark.parametrize(("inputs", "message"), [
    ([*pair(1), fp32("INPUT2", 1)], r"model 'simple' has no input 'INPUT2' \(its inputs: "
                                    r"INPUT0, INPUT1\)"),
    ([fp32("INPUT0", 1)], "model 'simple': input 'INPUT1' is missing"),
    ([], "input 'INPUT0', 'INPUT1' are missing"),
    ([fp32("INPUT0", 1), fp32("INPUT0", 1), fp32("INPUT1", 1)], "'INPUT0' is given twice"),
    ([fp32("INPUT0", 1), Tensor("INPUT1", "FP64", (1, 16), bytes(128))],
     r"input 'INPUT1': datatype FP64, model 'simple' takes FP32"),
    ([fp32("INPUT0", 1), fp32("INPUT1", 1, width=15)],
     r"input 'INPUT1': shape \[1, 15\], model 'simple' takes \[-1, 16\]"),
    ([fp32("INPUT0", 1), Tensor("INPUT1", "FP32", (16,), bytes(64))],
     r"shape \[16\], model 'simple' takes \[-1, 16\]"),
    ([fp32("INPUT0", 1), Tensor("INPUT1", "FP32", (1, 1, 16), bytes(64))],
     r"shape \[1, 1, 16\], model 'simple' takes \[-1, 16\]"),
    ([fp32("INPUT0", 1), Tensor("INPUT1", "FP32", (0, 16), b"")], "has no rows"),
    ([fp32("INPUT0", 1), Tensor("INPUT1", "FP32", (1, 16), bytes(60))],
     "input 'INPUT1': shape \\[1, 16\\] of FP32 takes 64 bytes, its data has 60"),
    ([fp32("INPUT0", 1), fp32("INPUT1", 3)],
     "inputs disagree on the request's rows: 'INPUT0' has 1, 'INPUT1' has 3"),
    (pair(9), r"the request has 9 rows, model 'simple' takes at most 8 per request"),
])
def test_a_request_that_differs_says_exactly_what(inputs: list[Tensor], message: str) -> None:
    with pytest.raises(TensorError, match=message):
        simple().check(inputs)


def test_requested_outputs_must_be_the_models_and_asked_once() -> None:
    with pytest.raises(TensorError, match=r"has no output 'OUT' \(its outputs: OUTPUT0, OUTPUT1\)"):
        simple().check(pair(1), ["OUTPUT0", "OUT"])
    with pytest.raises(TensorError, match="output 'OUTPUT0' is requested twice"):
        simple().check(pair(1), ["OUTPUT0", "OUTPUT0"])


def test_a_model_without_batching_takes_the_whole_shape_as_declared() -> None:
    model = simple(0)
    request = model.check([Tensor("INPUT0", "FP32", (16,), bytes(64)),
                           Tensor("INPUT1", "FP32", (16,), bytes(64))])
    assert request.rows == 1 and not request.batched
    with pytest.raises(TensorError, match=r"shape \[1, 16\], model 'simple' takes \[16\]"):
        model.check(pair(1))


def test_the_signature_names_what_a_batch_must_share() -> None:
    one, three = simple().check(pair(1), ["OUTPUT1", "OUTPUT0"]), simple().check(pair(3))
    assert one.signature == Signature("simple", "", (("INPUT0", "FP32", (16,)),
                                                     ("INPUT1", "FP32", (16,))),
                                      ("OUTPUT0", "OUTPUT1"))
    assert three.signature == one.signature._replace(outputs=())
    assert simple().check(pair(3), ["OUTPUT0", "OUTPUT1"]).signature == one.signature
    assert simple().check(pair(1), version="1").signature != three.signature


def test_variable_dimensions_put_other_shapes_in_other_lanes() -> None:
    metadata = {"name": "t", "inputs": [{"name": "s", "datatype": "BYTES", "shape": ["-1", "-1"]}],
                "outputs": [{"name": "y", "datatype": "BYTES", "shape": ["-1", "-1"]}]}
    model = ModelInterface.from_triton(metadata, {"max_batch_size": 4})
    two = model.check([Tensor("s", "BYTES", (1, 2), pack_bytes([b"a", b"b"]))])
    three = model.check([Tensor("s", "BYTES", (2, 3), pack_bytes([b"x"] * 6))])
    assert two.signature.inputs == (("s", "BYTES", (2,)),)
    assert three.signature.inputs == (("s", "BYTES", (3,)),)
    with pytest.raises(TensorError, match="holds 3 elements, its data 2"):
        model.check([Tensor("s", "BYTES", (1, 3), pack_bytes([b"a", b"b"]))])
