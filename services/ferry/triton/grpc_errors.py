"""gRPC errors as Ferry's: transient, permanent, or an unknown model. The one translation, used
by the backend's calls and by the tensor infer call (``ferry.triton.oip``)."""

from __future__ import annotations

import grpc

from ferry.errors import (
    BackendError,
    PermanentBackendError,
    TransientBackendError,
    UnknownModelError,
)

# gRPC codes after which the same call may well succeed.
_TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED",
                        "CANCELLED", "UNKNOWN"})


def translate(exc: Exception, what: str) -> BackendError:
    """A gRPC exception as transient or permanent, or as an unknown model."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code, message = str(exc.code()), str(exc.details())
    else:
        code, message = "", str(exc)
    code = code.removeprefix("StatusCode.")
    text = f"{what}: {code or type(exc).__name__}: {message}"
    if code == "NOT_FOUND" or "unknown model" in message.lower():
        return UnknownModelError(text, code=code, reason=message)
    if code in _TRANSIENT or isinstance(exc, (ConnectionError, TimeoutError)):
        return TransientBackendError(text, code=code, reason=message)
    return PermanentBackendError(text, code=code, reason=message)
