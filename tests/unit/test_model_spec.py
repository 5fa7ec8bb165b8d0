"""The model contract: Triton's metadata and config checked into a ModelSpec."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from ferry.errors import ModelContractError, PermanentBackendError
from ferry.triton.base import ModelSpec, split_rows, stack_payloads


def metadata() -> dict[str, Any]:
    return {
        "name": "sim",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": ["-1", "1"]}],
        "outputs": [{"name": "OUTPUT", "datatype": "BYTES", "shape": ["-1", "1"]}],
    }


def config() -> dict[str, Any]:
    return {
        "name": "sim",
        "max_batch_size": 64,
        "parameters": {"ferry_input_kind": {"string_value": "image"}},
    }


def contract_error(meta: dict[str, Any], conf: dict[str, Any]) -> str:
    with pytest.raises(ModelContractError) as info:
        ModelSpec.from_triton(meta, conf)
    return str(info.value)


# --- from_triton --------------------------------------------------------------------------------


def test_from_triton() -> None:
    spec = ModelSpec.from_triton(metadata(), config())
    assert spec == ModelSpec(name="sim", version="1", input_name="INPUT", outputs=("OUTPUT",),
                             max_batch_size=64, input_kind="image")


def test_max_batch_size_as_string_is_accepted() -> None:
    conf = config()
    conf["max_batch_size"] = "8"
    assert ModelSpec.from_triton(metadata(), conf).max_batch_size == 8


def test_input_kind_defaults_to_bytes() -> None:
    conf = config()
    del conf["parameters"]
    assert ModelSpec.from_triton(metadata(), conf).input_kind == "bytes"


def test_other_parameters_leave_input_kind_bytes() -> None:
    conf = config()
    conf["parameters"] = {"fixed_ms": {"string_value": "5"}}
    assert ModelSpec.from_triton(metadata(), conf).input_kind == "bytes"


@pytest.mark.parametrize("kind", ["bytes", "text", "image"])
def test_every_input_kind(kind: str) -> None:
    conf = config()
    conf["parameters"]["ferry_input_kind"] = {"string_value": kind}
    assert ModelSpec.from_triton(metadata(), conf).input_kind == kind


def test_last_version_is_used() -> None:
    meta = metadata()
    meta["versions"] = ["1", "2", "3"]
    assert ModelSpec.from_triton(meta, config()).version == "3"


def test_no_versions_gives_empty_version() -> None:
    meta = metadata()
    del meta["versions"]
    assert ModelSpec.from_triton(meta, config()).version == ""


def test_several_outputs_keep_their_order() -> None:
    meta = metadata()
    meta["outputs"] = [{"name": "LABELS", "datatype": "BYTES", "shape": ["-1", "1"]},
                       {"name": "SCORES", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert ModelSpec.from_triton(meta, config()).outputs == ("LABELS", "SCORES")


def test_integer_shape_is_accepted() -> None:
    meta = metadata()
    meta["inputs"][0]["shape"] = [-1, 1]
    assert ModelSpec.from_triton(meta, config()).input_name == "INPUT"


def test_inputs_are_not_modified() -> None:
    meta, conf = metadata(), config()
    before = copy.deepcopy((meta, conf))
    ModelSpec.from_triton(meta, conf)
    assert (meta, conf) == before


@pytest.mark.parametrize("max_batch", [0, -1, "0"])
def test_max_batch_size_zero_is_a_contract_violation(max_batch: int | str) -> None:
    conf = config()
    conf["max_batch_size"] = max_batch
    message = contract_error(metadata(), conf)
    assert message == "model 'sim': max_batch_size must be > 0 (batching)"


def test_missing_max_batch_size_is_a_contract_violation() -> None:
    conf = config()
    del conf["max_batch_size"]
    assert "max_batch_size must be > 0" in contract_error(metadata(), conf)


def test_two_inputs_are_a_contract_violation() -> None:
    meta = metadata()
    meta["inputs"].append({"name": "EXTRA", "datatype": "BYTES", "shape": ["-1", "1"]})
    assert contract_error(meta, config()) == "model 'sim': needs exactly one input, has 2"


def test_no_input_is_a_contract_violation() -> None:
    meta = metadata()
    meta["inputs"] = []
    assert contract_error(meta, config()) == "model 'sim': needs exactly one input, has 0"


def test_fp32_input_is_a_contract_violation() -> None:
    meta = metadata()
    meta["inputs"][0]["datatype"] = "FP32"
    assert contract_error(meta, config()) == (
        "model 'sim': its input must be BYTES (TYPE_STRING) with dims [1], is FP32 [1]")


@pytest.mark.parametrize(
    ("shape", "dims"),
    [(["-1", "3"], "[3]"), (["-1", "1", "1"], "[1, 1]"), (["-1"], "[]"), (["-1", "-1"], "[-1]")],
)
def test_input_dims_other_than_one_are_a_contract_violation(shape: list[str], dims: str) -> None:
    meta = metadata()
    meta["inputs"][0]["shape"] = shape
    assert contract_error(meta, config()) == (
        f"model 'sim': its input must be BYTES (TYPE_STRING) with dims [1], is BYTES {dims}")


@pytest.mark.parametrize("kind", ["video", "", "IMAGE"])
def test_unknown_input_kind_is_a_contract_violation(kind: str) -> None:
    conf = config()
    conf["parameters"]["ferry_input_kind"] = {"string_value": kind}
    assert contract_error(metadata(), conf) == (
        f"model 'sim': ferry_input_kind must be one of bytes, text, image, is {kind!r}")


def test_contract_error_is_permanent() -> None:
    assert issubclass(ModelContractError, PermanentBackendError)
    assert ModelContractError.transient is False


# --- split_rows / stack_payloads ----------------------------------------------------------------


def test_stack_payloads_is_a_batch_by_one_object_tensor() -> None:
    tensor = stack_payloads([b"a", b"bb", b"\x00"])
    assert tensor.shape == (3, 1)
    assert tensor.dtype == np.object_
    assert tensor.tolist() == [[b"a"], [b"bb"], [b"\x00"]]


def test_stack_payloads_keeps_equal_length_payloads_as_bytes() -> None:
    tensor = stack_payloads([b"ab", b"cd"])
    assert tensor.shape == (2, 1)
    assert tensor.dtype == np.object_
    assert tensor[1, 0] == b"cd"


def test_stack_payloads_of_one() -> None:
    assert stack_payloads([b"x"]).shape == (1, 1)


def test_stack_payloads_of_none() -> None:
    assert stack_payloads([]).shape == (0, 1)


def test_split_rows_gives_one_dict_per_request() -> None:
    outputs = {"OUTPUT": np.array([[b"r0"], [b"r1"], [b"r2"]], dtype=np.object_),
               "SCORES": np.arange(6, dtype=np.float32).reshape(3, 2)}
    rows = split_rows(outputs, 3)
    assert len(rows) == 3
    assert [sorted(row) for row in rows] == [["OUTPUT", "SCORES"]] * 3
    assert rows[1]["OUTPUT"].tolist() == [b"r1"]
    assert rows[1]["OUTPUT"].shape == (1,)
    assert rows[2]["SCORES"].tolist() == [4.0, 5.0]


def test_split_rows_with_no_outputs() -> None:
    assert split_rows({}, 2) == [{}, {}]


def test_split_rows_refuses_wrong_row_count() -> None:
    outputs = {"OUTPUT": np.array([[b"r0"], [b"r1"]], dtype=np.object_)}
    with pytest.raises(ModelContractError, match=r"^output 'OUTPUT' has 2 rows for 3 inputs$"):
        split_rows(outputs, 3)
