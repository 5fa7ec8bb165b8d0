"""A tensor model's interface, read from Triton, and a request's tensors checked against it.

Pure code, no I/O. The interface comes from Triton's model metadata and config, in the JSON
shape Triton documents (``MessageToDict(..., preserving_proto_field_name=True)`` of the gRPC
replies). A request is checked before anything is enqueued: every input the model takes and no
other, each of its datatype, of a shape the model's dims allow (-1: any size) and with exactly
the bytes its shape names; for a batched model the first dimension is the request's own rows,
one count for every input and at most ``max_batch_size``. Nothing is padded or converted: a
request that differs is refused with a ``TensorError`` that says what differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ferry.errors import ModelContractError
from ferry.tensors import DATATYPES, Tensor, TensorError, checked

ANY = -1  # a dimension of any size


class UnsupportedModelError(ModelContractError):
    """A model a queue cannot stand in front of: stateful (sequence batching) or decoupled (any
    number of responses per request)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the model declares it; ``dims`` leave out the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False

    def allows(self, shape: Sequence[int]) -> bool:
        """Whether a shape (without the batch dimension) fits these dims."""
        return len(shape) == len(self.dims) and all(
            want in (ANY, got) for want, got in zip(self.dims, shape, strict=True))


class Signature(NamedTuple):
    """What requests must share to travel in one batch: the model and version, each input's
    name, datatype and non-batch shape, and the outputs asked for (sorted; empty = all)."""

    model: str
    version: str
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class CheckedRequest:
    """A request that fits its model: inputs in the model's order, the outputs as asked."""

    model: str
    version: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...]  # in the client's order; empty = every output
    rows: int  # the request's rows (1 for a model that does not batch)
    batched: bool

    @property
    def signature(self) -> Signature:
        def shape(tensor: Tensor) -> tuple[int, ...]:
            return tensor.shape[1:] if self.batched else tensor.shape

        return Signature(self.model, self.version,
                         tuple((t.name, t.datatype, shape(t)) for t in self.inputs),
                         tuple(sorted(self.outputs)))


@dataclass(frozen=True)
class ModelInterface:
    """A model's tensors as Triton serves them, and how many rows one request may carry."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int  # 0: the model does not batch, requests go one at a time

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def newest(self) -> str:
        """The last version Triton lists (the one a request that names none gets, as
        ``ModelSpec`` takes it); '' if it lists none."""
        return self.versions[-1] if self.versions else ""

    @classmethod
    def from_triton(cls, metadata: Mapping[str, Any],
                    config: Mapping[str, Any]) -> ModelInterface:
        """The interface in Triton's metadata and config; stateful and decoupled models are
        refused with ``UnsupportedModelError``."""
        name = str(metadata.get("name") or config.get("name") or "?")
        _refuse_unsupported(name, config)
        max_batch = int(config.get("max_batch_size", 0))
        if max_batch < 0:
            raise ModelContractError(f"model {name!r}: max_batch_size {max_batch} is negative")
        optional = {str(i.get("name")) for i in config.get("input", []) or [] if i.get("optional")}
        return cls(
            name=name,
            versions=tuple(str(v) for v in metadata.get("versions", []) or []),
            platform=str(metadata.get("platform", "")),
            inputs=tuple(_tensor_spec(name, t, max_batch > 0, optional)
                         for t in metadata.get("inputs", []) or []),
            outputs=tuple(_tensor_spec(name, t, max_batch > 0, set())
                          for t in metadata.get("outputs", []) or []),
            max_batch_size=max_batch,
        )

    def check(self, inputs: Sequence[Tensor], outputs: Sequence[str] = (),
              version: str = "") -> CheckedRequest:
        """The request's tensors checked against the model (``TensorError`` says what differs),
        in the model's input order, with the outputs it asked for."""
        given = self._given(inputs)
        tensors = tuple(self._input(spec, given[spec.name])
                        for spec in self.inputs if spec.name in given)
        rows = self._rows(tensors)
        self._check_outputs(outputs)
        return CheckedRequest(self.name, version, tensors, tuple(outputs), rows, self.batched)

    def _given(self, inputs: Sequence[Tensor]) -> dict[str, Tensor]:
        known = {spec.name: spec for spec in self.inputs}
        given: dict[str, Tensor] = {}
        for tensor in inputs:
            if tensor.name not in known:
                raise TensorError(f"model {self.name!r} has no input {tensor.name!r} (its "
                                  f"inputs: {_names(self.inputs)})")
            if tensor.name in given:
                raise TensorError(f"input {tensor.name!r} is given twice")
            given[tensor.name] = tensor
        missing = [s.name for s in self.inputs if s.name not in given and not s.optional]
        if missing:
            raise TensorError(f"model {self.name!r}: input {', '.join(map(repr, missing))} "
                              f"{'is' if len(missing) == 1 else 'are'} missing")
        return given

    def _input(self, spec: TensorSpec, tensor: Tensor) -> Tensor:
        if tensor.datatype != spec.datatype:
            raise TensorError(f"input {spec.name!r}: datatype {tensor.datatype}, model "
                              f"{self.name!r} takes {spec.datatype}")
        batch, rest = (tensor.shape[:1], tensor.shape[1:]) if self.batched else ((), tensor.shape)
        if (self.batched and not batch) or not spec.allows(rest):
            expected = [ANY, *spec.dims] if self.batched else list(spec.dims)
            raise TensorError(f"input {spec.name!r}: shape {list(tensor.shape)}, model "
                              f"{self.name!r} takes {expected} (-1: any size)")
        if self.batched and batch[0] < 1:
            raise TensorError(f"input {spec.name!r}: shape {list(tensor.shape)} has no rows "
                              "(its first dimension is the request's rows, at least 1)")
        return checked(tensor.name, tensor.datatype, tensor.shape, tensor.raw)

    def _rows(self, tensors: Sequence[Tensor]) -> int:
        if not self.batched or not tensors:
            return 1
        first = tensors[0]
        for other in tensors[1:]:
            if other.rows != first.rows:
                raise TensorError(f"inputs disagree on the request's rows: {first.name!r} has "
                                  f"{first.rows}, {other.name!r} has {other.rows}")
        if first.rows > self.max_batch_size:
            raise TensorError(f"the request has {first.rows} rows, model {self.name!r} takes at "
                              f"most {self.max_batch_size} per request (max_batch_size)")
        return first.rows

    def _check_outputs(self, outputs: Sequence[str]) -> None:
        known = {spec.name for spec in self.outputs}
        seen: set[str] = set()
        for name in outputs:
            if name not in known:
                raise TensorError(f"model {self.name!r} has no output {name!r} (its outputs: "
                                  f"{_names(self.outputs)})")
            if name in seen:
                raise TensorError(f"output {name!r} is requested twice")
            seen.add(name)


def _refuse_unsupported(name: str, config: Mapping[str, Any]) -> None:
    if "sequence_batching" in config:
        raise UnsupportedModelError(f"model {name!r} is stateful (sequence_batching): its "
                                    "requests belong to sequences, which a queue cannot keep")
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        raise UnsupportedModelError(f"model {name!r} is decoupled: it may answer a request any "
                                    "number of times, which a queued task cannot carry")


def _tensor_spec(model: str, tensor: Mapping[str, Any], batched: bool,
                 optional: set[str]) -> TensorSpec:
    """One tensor of the metadata; a batched model's shapes start with its batch dim, -1."""
    name, datatype = str(tensor.get("name", "")), str(tensor.get("datatype", ""))
    dims = tuple(int(d) for d in tensor.get("shape", []) or [])
    if datatype not in DATATYPES:
        raise ModelContractError(f"model {model!r}: tensor {name!r} has datatype {datatype!r}, "
                                 "which Ferry does not know")
    if batched:
        if not dims or dims[0] != ANY:
            raise ModelContractError(f"model {model!r}: tensor {name!r} has shape {list(dims)}, "
                                     "without the batch dimension (-1) first")
        dims = dims[1:]
    return TensorSpec(name, datatype, dims, name in optional)


def _names(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(spec.name for spec in specs) or "none"
