"""What Ferry needs from an inference server, and the model contract it relies on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ferry.errors import ModelContractError
from ferry.triton.tensors import Rows

if TYPE_CHECKING:  # the tensor codec and the gRPC stubs load only where tensors travel
    from ferry.tensors import Tensor
    from ferry.triton.oip import InferredTensors

INPUT_KINDS = ("bytes", "text", "image")
INPUT_KIND_PARAMETER = "ferry_input_kind"
# The version a request that pins none goes to while its model has no rollout (Triton's version
# policy would pick its newest: a candidate put beside the stable version would take everyone).
DEFAULT_VERSION_PARAMETER = "ferry_default_version"


@dataclass(frozen=True)
class ModelSpec:
    """A model as Ferry uses it: where its one BYTES input goes, what comes out, how big a batch."""

    name: str
    version: str  # newest version when read; infer calls let Triton's version policy choose
    input_name: str
    outputs: tuple[str, ...]
    max_batch_size: int
    input_kind: str = "bytes"  # what the gateway checks before enqueueing: bytes, text or image
    instances: int = 1  # model instances Triton runs: batches that can execute at once
    default_version: str = ""  # what a request that pins none goes to ('': Triton's policy)

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
            instances=instance_count(config),
            default_version=default_version(config),
        )


def instance_count(config: Mapping[str, Any]) -> int:
    """How many instances Triton runs for a model: ``count`` per group, per listed GPU.

    Triton's normalized config lists the GPUs of a KIND_GPU group; a group without one counts once.
    """
    total = 0
    for group in config.get("instance_group", []) or []:
        gpus = group.get("gpus") or []
        total += max(1, int(group.get("count", 1))) * max(1, len(gpus))
    return max(1, total)


def ensemble_steps(config: Mapping[str, Any]) -> list[str]:
    """The models an ensemble's steps call (none for a model that is not an ensemble)."""
    if config.get("platform") != "ensemble":
        return []
    steps = config.get("ensemble_scheduling", {}).get("step", []) or []
    return [str(step["model_name"]) for step in steps if step.get("model_name")]


async def instances_of(server: ModelDiscovery, config: Mapping[str, Any]) -> int:
    """How many batches of the model ``config`` describes ``server`` runs at once: its
    instances, or an ensemble's narrowest step's."""
    steps = ensemble_steps(config)
    if not steps:
        return instance_count(config)
    return min([instance_count(await server.model_config(step)) for step in steps])


def default_version(config: Mapping[str, Any]) -> str:
    """The model's ``ferry_default_version`` ('': none; a version number otherwise)."""
    version = _parameter(config, DEFAULT_VERSION_PARAMETER, "").strip()
    if version and not version.isdigit():
        raise ModelContractError(f"model {config.get('name', '?')!r}: "
                                 f"{DEFAULT_VERSION_PARAMETER} must be a version number, is "
                                 f"{version!r}")
    return version


def _parameter(config: Mapping[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {})
    return str(value.get("string_value", default)) if isinstance(value, dict) else default


@dataclass(frozen=True)
class Inferred:
    """A batch's outputs, per request, and the model version that produced them."""

    rows: list[Rows]
    model_version: str


class ModelDiscovery(Protocol):
    """What an inference server says about itself and its models, in the JSON shapes Triton's
    HTTP endpoint gives (``GET /v2``, ``/v2/models/{m}[/versions/{v}]``, ``.../config``,
    ``.../stats``). An empty ``version`` lets the server's version policy choose. A refusal is a
    ``BackendError`` whose ``code`` and ``reason`` are the server's."""

    async def server_metadata(self) -> dict[str, Any]: ...

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]: ...

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]: ...

    async def model_ready(self, model: str, version: str = "") -> bool: ...

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]: ...


class InferenceBackend(ModelDiscovery, Protocol):
    """An inference server that takes whole batches."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def server_ready(self) -> bool: ...

    async def server_live(self) -> bool: ...

    async def ready_models(self) -> list[str]: ...

    async def model_spec(self, model: str, *, refresh: bool = False) -> ModelSpec: ...

    async def infer(self, spec: ModelSpec, payloads: Sequence[bytes],
                    version: str = "") -> Inferred:
        """One call with the whole batch's payloads, of ``version`` ('' : the server's
        version policy picks)."""
        ...

    async def infer_tensors(self, model: str, version: str, inputs: Sequence[Tensor],
                            outputs: Sequence[str] = (), request_id: str = ""
                            ) -> InferredTensors:
        """One call with a tensor batch's inputs, each joined along the batch dimension."""
        ...
