"""The model contract: Triton's metadata and config checked into a ModelSpec."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from ferry.errors import ModelContractError, PermanentBackendError
from ferry.tensors import pack_bytes, unpack_bytes
from ferry.triton.base import ModelSpec, ensemble_steps
from ferry.triton.tensors import output_rows


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


# --- instances ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([], 1),
        ([{"count": 1, "kind": "KIND_CPU"}], 1),
        ([{"count": 2, "kind": "KIND_CPU"}], 2),
        ([{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1, 2]}], 6),
        ([{"count": 1, "kind": "KIND_GPU", "gpus": [0]}, {"count": 3, "kind": "KIND_CPU"}], 4),
        ([{"kind": "KIND_GPU"}], 1),
    ],
)
def test_instances_count_every_group_on_every_gpu(groups: list[dict[str, Any]],
                                                  expected: int) -> None:
    conf = config()
    conf["instance_group"] = groups
    assert ModelSpec.from_triton(metadata(), conf).instances == expected


# --- raw tensors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("elements", [[b"a", b"bb", b"\x00"], [b""], [], [b"x" * 70_000]])
def test_pack_bytes_matches_tritonclients_encoding(elements: list[bytes]) -> None:
    reference = serialize_byte_tensor(np.array(elements, dtype=np.object_))
    expected = reference.item() if reference is not None and reference.size else b""
    assert pack_bytes(elements) == expected
    assert unpack_bytes(pack_bytes(elements)) == elements


def test_unpack_bytes_matches_tritonclients_decoding() -> None:
    raw = serialize_byte_tensor(np.array([b"r0", b"", b"\xffr2"], dtype=np.object_)).item()
    assert unpack_bytes(raw) == deserialize_bytes_tensor(raw).tolist() == [b"r0", b"",
                                                                            b"\xffr2"]


@pytest.mark.parametrize("raw", [b"\x05\x00\x00\x00abc", b"\x01\x00"])
def test_truncated_bytes_output_is_refused(raw: bytes) -> None:
    with pytest.raises(PermanentBackendError, match=r"^truncated BYTES tensor from Triton$"):
        output_rows("OUTPUT", "BYTES", [1, 1], raw, 1)


def test_bytes_output_rows_per_request() -> None:
    raw = pack_bytes([b"r0a", b"r0b", b"r1a", b"r1b"])
    assert output_rows("OUTPUT", "BYTES", [2, 2], raw, 2) == [[b"r0a", b"r0b"], [b"r1a", b"r1b"]]


def test_numeric_output_rows_per_request() -> None:
    tensor = np.arange(6, dtype="<f4").reshape(3, 2)
    rows = output_rows("SCORES", "FP32", [3, 2], tensor.tobytes(), 3)
    assert [row.tolist() for row in rows] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]  # type: ignore[union-attr]


def test_bf16_output_is_widened_to_float32() -> None:
    values = np.array([1.5, -2.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    rows = output_rows("X", "BF16", [2, 1], bf16, 2)
    assert [row.tolist() for row in rows] == [[1.5], [-2.0]]  # type: ignore[union-attr]


def test_output_with_the_wrong_row_count_is_a_contract_violation() -> None:
    with pytest.raises(ModelContractError, match=r"^output 'OUTPUT' has 2 rows for 3 inputs$"):
        output_rows("OUTPUT", "BYTES", [2, 1], pack_bytes([b"a", b"b"]), 3)


def test_bytes_output_with_too_few_elements_is_refused() -> None:
    with pytest.raises(PermanentBackendError, match="1 elements for shape"):
        output_rows("OUTPUT", "BYTES", [2, 1], pack_bytes([b"a"]), 2)


def test_unknown_output_datatype_is_refused() -> None:
    with pytest.raises(PermanentBackendError, match="datatype FP8"):
        output_rows("OUTPUT", "FP8", [1, 1], b"\x00", 1)


def test_the_steps_of_an_ensemble() -> None:
    config = {"platform": "ensemble", "ensemble_scheduling": {"step": [
        {"model_name": "pre", "model_version": "-1"}, {"model_name": "engine"},
        {"model_name": "post"}]}}
    assert ensemble_steps(config) == ["pre", "engine", "post"]
    assert ensemble_steps({"backend": "python"}) == []
    assert ensemble_steps({"platform": "ensemble"}) == []
