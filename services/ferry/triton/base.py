"""What Ferry needs from an inference server, and the model contract it relies on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ferry.errors import ModelContractError

INPUT_KINDS = ("bytes", "text", "image")
INPUT_KIND_PARAMETER = "ferry_input_kind"

Rows = dict[str, npt.NDArray[Any]]  # one request's outputs, batch dimension removed


@dataclass(frozen=True)
class ModelSpec:
    """A model as Ferry uses it: where its one BYTES input goes, what comes out, how big a batch."""

    name: str
    version: str  # newest version when read; infer calls let Triton's version policy choose
    input_name: str
    outputs: tuple[str, ...]
    max_batch_size: int
    input_kind: str = "bytes"  # what the gateway checks before enqueueing: bytes, text or image

    @classmethod
    def from_triton(cls, metadata: Mapping[str, Any], config: Mapping[str, Any]) -> ModelSpec:
        """Check Triton's model metadata and config against Ferry's contract."""
        name = str(metadata.get("name", "?"))
        inputs = list(metadata.get("inputs", []))
        max_batch = int(config.get("max_batch_size", 0))
        if max_batch <= 0:
            raise ModelContractError(f"model {name!r}: max_batch_size must be > 0 (batching)")
        if len(inputs) != 1:
            raise ModelContractError(f"model {name!r}: needs exactly one input, has {len(inputs)}")
        tensor = inputs[0]
        dims = [int(d) for d in tensor.get("shape", [])]
        if tensor.get("datatype") != "BYTES" or dims[1:] != [1]:
            raise ModelContractError(
                f"model {name!r}: its input must be BYTES (TYPE_STRING) with dims [1], "
                f"is {tensor.get('datatype')} {dims[1:]}")
        kind = _parameter(config, INPUT_KIND_PARAMETER, "bytes")
        if kind not in INPUT_KINDS:
            raise ModelContractError(f"model {name!r}: {INPUT_KIND_PARAMETER} must be one of "
                                     f"{', '.join(INPUT_KINDS)}, is {kind!r}")
        versions = list(metadata.get("versions", []))
        return cls(
            name=name,
            version=str(versions[-1]) if versions else "",
            input_name=str(tensor["name"]),
            outputs=tuple(str(o["name"]) for o in metadata.get("outputs", [])),
            max_batch_size=max_batch,
            input_kind=kind,
        )


def _parameter(config: Mapping[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {})
    return str(value.get("string_value", default)) if isinstance(value, dict) else default


def split_rows(outputs: Mapping[str, npt.NDArray[Any]], batch: int) -> list[Rows]:
    """Per-request rows of batched output tensors."""
    for name, tensor in outputs.items():
        if tensor.shape[0] != batch:
            rows = tensor.shape[0]
            raise ModelContractError(f"output {name!r} has {rows} rows for {batch} inputs")
    return [{name: tensor[i] for name, tensor in outputs.items()} for i in range(batch)]


def stack_payloads(payloads: Sequence[bytes]) -> npt.NDArray[np.object_]:
    """Payloads as a [B, 1] BYTES tensor: the batch on dimension 0."""
    return np.array(list(payloads), dtype=np.object_).reshape(len(payloads), 1)


@dataclass(frozen=True)
class Inferred:
    """A batch's outputs, per request, and the model version that produced them."""

    rows: list[Rows]
    model_version: str


class InferenceBackend(Protocol):
    """An inference server that takes whole batches."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def server_ready(self) -> bool: ...

    async def server_live(self) -> bool: ...

    async def ready_models(self) -> list[str]: ...

    async def model_spec(self, model: str, *, refresh: bool = False) -> ModelSpec: ...

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes]) -> Inferred: ...
