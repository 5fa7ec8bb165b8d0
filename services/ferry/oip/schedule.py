"""An infer request as a Ferry task: Triton's scheduling parameters mapped onto Ferry's, and
what identical requests share. Pure code, no I/O.

Triton's ``priority`` counts from 1, the highest; 0 (or none) is the model's default. Ferry has
three priorities: 1 is ``high``, 0 and 2 ``normal``, 3 and above ``low``. Triton's ``timeout``
(microseconds; 0 or none: no timeout) is the task's deadline: admission refuses a task its
predicted wait cannot meet, and a task still queued at its deadline ends EXPIRED, answered as
Triton answers a request whose timeout expired (503, ``Request timeout expired``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry.oip.request import InferRequest
from ferry.oip.spec import CheckedRequest, ModelInterface
from ferry.priority import Priority
from ferry.tensors import TensorError

MAX_TIMEOUT_US = 86_400_000_000  # a day, the longest deadline /v1 takes too
KNOWN_PARAMETERS = frozenset({"binary_data_output", "priority", "timeout"})
# Accepted and without effect: asks a decoupled model for an empty last response (Ferry serves
# no decoupled model); tritonclient's gRPC streams and perf_analyzer send it on every request.
IGNORED_PARAMETERS = frozenset({"triton_enable_empty_final_response"})
SEQUENCE_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end"})
_DOMAIN = b"ferry-oip\0"  # tensor digests never equal a /v1 payload's (those start with digits)


@dataclass(frozen=True)
class TensorTask:
    """A checked infer request, as the gateway queues it.

    ``newest`` is the model's newest version when the request names none and the answer is to
    be shared only with requests that version answers (``/v1``'s tensor form; '' for ``/v2``).
    With ``own_id`` the record's answer is served as it is (``GET /v1/result``), so identical
    requests share it only when their ``id`` is the same too.
    """

    request: CheckedRequest
    request_id: str = ""
    priority: Priority = Priority.NORMAL
    timeout_s: float | None = None  # seconds from admission; None: no deadline
    newest: str = ""
    own_id: bool = False

    @property
    def version(self) -> str:
        """The version whose answers this task shares: the one asked for, else ``newest``."""
        return self.request.version or self.newest

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of what decides the answer: the model, its version, every input
        (name, datatype, shape, bytes) and the outputs asked for (and the request's id, with
        ``own_id``); the result cache and request collapsing key on it."""
        return self._digest(self.version)

    @property
    def request_digest(self) -> str:
        """As ``digest``, with the version the request asked for (none: none): what makes a
        repeat the same request (an idempotency key's), whichever version is newest now."""
        return self._digest(self.request.version)

    def _digest(self, version: str) -> str:
        sha = hashlib.sha256(_DOMAIN)
        request = self.request
        for part in (request.model, version, *sorted(request.outputs)):
            sha.update(b"%d:%s" % (len(part.encode()), part.encode()))
        if self.own_id:  # its id, even none, is in its answer; "id" cannot be a part's length
            sha.update(b"id%d:%s" % (len(self.request_id.encode()), self.request_id.encode()))
        for tensor in request.inputs:
            sha.update(b"%d:%s%s:%r%d:" % (len(tensor.name.encode()), tensor.name.encode(),
                                          tensor.datatype.encode(), tensor.shape,
                                          len(tensor.raw)))
            sha.update(tensor.raw)
        return sha.hexdigest()


def tensor_task(interface: ModelInterface, request: InferRequest, version: str, *,
                own_id: bool = False) -> TensorTask:
    """The task for a request, checked against the model (a ``TensorError`` says what
    differs), with its priority and deadline from the request's parameters; its answer shared
    with the identical requests the newest version answers (``own_id``: of the same id too, for
    a record that is served as it is)."""
    checked = interface.check(request.inputs, request.output_names, version)
    priority, timeout_s = schedule(request.parameters)
    return TensorTask(checked, request.id, priority, timeout_s, newest=interface.newest,
                      own_id=own_id)


def schedule(parameters: Mapping[str, Any]) -> tuple[Priority, float | None]:
    """The priority and deadline (seconds; None: none) Triton's parameters ask for."""
    sequence = sorted(SEQUENCE_PARAMETERS & parameters.keys())
    if sequence:
        raise TensorError(f"parameter {sequence[0]!r}: sequences (stateful models) are not "
                          "supported: a queue cannot keep a sequence's requests in order")
    unknown = sorted(parameters.keys() - KNOWN_PARAMETERS - IGNORED_PARAMETERS)
    if unknown:
        raise TensorError(f"parameter {unknown[0]!r} is not supported (Ferry takes "
                          f"{', '.join(sorted(KNOWN_PARAMETERS))}, and over gRPC "
                          "respond_async; it ignores "
                          f"{', '.join(sorted(IGNORED_PARAMETERS))})")
    return (priority_of(_count(parameters, "priority")),
            timeout_of(_count(parameters, "timeout")))


def priority_of(level: int) -> Priority:
    """Triton's priority level (1 the highest, 0 the default) as Ferry's priority."""
    if level == 1:
        return Priority.HIGH
    return Priority.NORMAL if level in (0, 2) else Priority.LOW


def timeout_of(microseconds: int) -> float | None:
    """Triton's timeout as seconds (None for 0: no timeout)."""
    if microseconds > MAX_TIMEOUT_US:
        raise TensorError(f"parameter 'timeout' is {microseconds} us, more than a day "
                          f"({MAX_TIMEOUT_US} us)")
    return microseconds / 1e6 if microseconds else None


def _count(parameters: Mapping[str, Any], name: str) -> int:
    value = parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TensorError(f"parameter {name!r} must be an unsigned integer, is {value!r}")
    return value
