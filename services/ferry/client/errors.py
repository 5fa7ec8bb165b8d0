"""The client's exceptions: one class per error ``code`` the ``/v1`` API documents.

Every refusal the gateway answers is ``{"error": {"code", "message"}}`` with an HTTP status;
``error_from_answer`` turns it into the class named for its code, under a class for its kind
(``InvalidRequestError`` for a 400, ``OverloadedError`` for a 429...), so a caller catches
as broadly or as narrowly as it needs. A code this client does not know yet gets its kind's
class. These are the client's own: ``ferry.errors`` is the server's hierarchy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class FerryError(Exception):
    """Base of every error the client raises: the ``code`` and ``message`` the gateway
    answered, its HTTP ``status`` (0: no answer came), ``retry_after`` (seconds, from the
    ``Retry-After`` header; None when it sent none) and the error body's other fields
    (``details``: an invalid manifest's ``lines``, say)."""

    code: str = ""  # the class's code; an instance's is the one answered

    def __init__(self, message: str, *, code: str = "", status: int = 0,
                 retry_after: float | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        self.status = status
        self.retry_after = retry_after
        self.details: Mapping[str, Any] = details or {}

    def __str__(self) -> str:
        head = f"{self.status} {self.code}" if self.status else self.code
        return f"{head}: {self.message}" if head else self.message


class ConnectionFailedError(FerryError):
    """The gateway could not be reached (or the connection broke) on every attempt."""

    code = "connection_failed"


class ResultTimeoutError(FerryError):
    """A task was not finished within the seconds the caller was willing to wait; the task
    goes on (``task_id``), and its result can be asked for again."""

    code = "result_timeout"

    def __init__(self, task_id: str, waited_s: float) -> None:
        super().__init__(f"task {task_id} did not finish within {waited_s:g} s")
        self.task_id = task_id


# The kinds, by HTTP status.
class InvalidRequestError(FerryError):
    """400, 405, 408, 413, 415, 422: the request is not one the API takes."""


class AuthenticationError(FerryError):
    """401: no credential, or one the gateway does not accept."""


class PermissionDeniedError(FerryError):
    """403: the credential may not do this."""


class NotFoundError(FerryError):
    """404: no such model, version, task or job (or another client's)."""


class ConflictError(FerryError):
    """409: the task or job is in a state that does not allow this."""


class OverloadedError(FerryError):
    """429: refused for now (a limit); retried by the client, honouring ``retry_after``."""


class InternalServerError(FerryError):
    """500: a bug in the gateway."""


class UnavailableError(FerryError):
    """503: Redis, Triton or the model cannot serve now; retried by the client."""


# 400: the body or the query.
class MalformedJsonError(InvalidRequestError):
    """The body is not JSON."""
    code = "malformed_json"


class MissingInputError(InvalidRequestError):
    """No ``input`` nor ``input_base64``."""
    code = "missing_input"


class EmptyInputError(InvalidRequestError):
    """An empty payload."""
    code = "empty_input"


class AmbiguousInputError(InvalidRequestError):
    """More than one input form."""
    code = "ambiguous_input"


class InvalidBase64Error(InvalidRequestError):
    """``input_base64`` is not base64."""
    code = "invalid_base64"


class UnknownFieldError(InvalidRequestError):
    """A JSON field the API does not take."""
    code = "unknown_field"


class InvalidFieldError(InvalidRequestError):
    """A JSON field with a value the API does not take."""
    code = "invalid_field"


class InvalidTextError(InvalidRequestError):
    """Text that is not valid UTF-8."""
    code = "invalid_text"


class InvalidTensorsError(InvalidRequestError):
    """The tensor form does not fit the model's tensors."""
    code = "invalid_tensors"


class UndecodableImageError(InvalidRequestError):
    """An image model's payload does not decode as an image."""
    code = "undecodable_image"


class UnknownParameterError(InvalidRequestError):
    """A query parameter the route does not take."""
    code = "unknown_parameter"


class InvalidWaitError(InvalidRequestError):
    """``wait`` is out of range or not a number."""
    code = "invalid_wait"


class InvalidParameterError(InvalidRequestError):
    """A query parameter with a value the route does not take, or given twice."""
    code = "invalid_parameter"


class InvalidPriorityError(InvalidRequestError):
    """``priority`` is not high, normal, low or batch."""
    code = "invalid_priority"


class InvalidTimeoutError(InvalidRequestError):
    """The timeout is not a number of seconds in (0, 86400]."""
    code = "invalid_timeout"


class InvalidIdempotencyKeyError(InvalidRequestError):
    """The ``Idempotency-Key`` is empty, too long or not printable ASCII."""
    code = "invalid_idempotency_key"


class WebhooksDisabledError(InvalidRequestError):
    """A callback URL while webhooks are off."""
    code = "webhooks_disabled"


class CallbackNotAllowedError(InvalidRequestError):
    """A callback URL to a host not on the allowlist."""
    code = "callback_not_allowed"


class InvalidCallbackError(InvalidRequestError):
    """A callback URL that is not a plain http(s) URL."""
    code = "invalid_callback"


class IncompleteBodyError(InvalidRequestError):
    """The body did not all arrive."""
    code = "incomplete_body"


class HeaderTimeoutError(InvalidRequestError):
    """408: the headers did not all arrive in time."""
    code = "header_timeout"


class BodyTimeoutError(InvalidRequestError):
    """408: the body stalled."""
    code = "body_timeout"


class MethodNotAllowedError(InvalidRequestError):
    """405: the route does not take this method."""
    code = "method_not_allowed"


class BodyTooLargeError(InvalidRequestError):
    """413: the body is over the gateway's limit."""
    code = "body_too_large"


class ImageTooLargeError(InvalidRequestError):
    """413: the image has too many pixels."""
    code = "image_too_large"


class UnsupportedMediaTypeError(InvalidRequestError):
    """415: a ``Content-Type`` the route does not take."""
    code = "unsupported_media_type"


class UnsupportedModelError(InvalidRequestError):
    """422: the model does not follow Ferry's contract for this form."""
    code = "unsupported_model"


class IdempotencyKeyReusedError(InvalidRequestError):
    """422: the ``Idempotency-Key`` was sent before with another request."""
    code = "idempotency_key_reused"


# Jobs (docs/jobs.md).
class InvalidManifestError(InvalidRequestError):
    """A job's manifest has bad lines (``details["lines"]`` lists them); nothing was queued."""
    code = "invalid_manifest"


class ManifestTooLargeError(InvalidRequestError):
    """413: the manifest is over ``FERRY_JOB_MAX_BYTES``."""
    code = "manifest_too_large"


class TooManyItemsError(InvalidRequestError, OverloadedError):
    """413: the manifest has too many items; 429: the client's unfinished jobs hold too many."""
    code = "too_many_items"


class EmptyManifestError(InvalidRequestError):
    """A manifest with no item."""
    code = "empty_manifest"


class InvalidCompletionWindowError(InvalidRequestError):
    """A completion window that is not a duration within the gateway's limit."""
    code = "invalid_completion_window"


# 401 and 403.
class UnauthenticatedError(AuthenticationError):
    """No credential."""
    code = "unauthenticated"


class InvalidAuthorizationError(AuthenticationError):
    """An ``Authorization`` header that is not ``Bearer``."""
    code = "invalid_authorization"


class InvalidApiKeyError(AuthenticationError):
    """An API key the gateway does not accept."""
    code = "invalid_api_key"


class InvalidTokenError(AuthenticationError):
    """A JWT the gateway does not accept."""
    code = "invalid_token"


class InvalidClientIdError(AuthenticationError):
    """A credential's client id the gateway does not accept."""
    code = "invalid_client_id"


class ClientIdMismatchError(PermissionDeniedError):
    """A ``client_id`` naming another client than the credential."""
    code = "client_id_mismatch"


# 404.
class UnknownModelError(NotFoundError):
    """No such ready model."""
    code = "unknown_model"


class UnknownTaskError(NotFoundError):
    """No such task, or its result expired."""
    code = "unknown_task"


class UnknownModelVersionError(NotFoundError):
    """The version pinned is not ready in Triton."""
    code = "unknown_model_version"


class UnknownJobError(NotFoundError):
    """No such job."""
    code = "unknown_job"


class RouteNotFoundError(NotFoundError):
    """No route at this path (a client pointed at the wrong base URL, or an older gateway)."""
    code = "not_found"


# 409.
class AlreadyFinishedError(ConflictError):
    """The task or job has already ended."""
    code = "already_finished"


class AlreadyRunningError(ConflictError):
    """The task is being inferred: too late to cancel."""
    code = "already_running"


class SharedInferenceError(ConflictError):
    """The task is the one identical requests follow: it cannot be cancelled."""
    code = "shared_inference"


class NothingToRetryError(ConflictError):
    """The job is still running, or has no failed item."""
    code = "nothing_to_retry"


# 429.
class BacklogFullError(OverloadedError):
    """The model's backlog is full for this priority."""
    code = "backlog_full"


class DeadlineUnmeetableError(OverloadedError):
    """The predicted wait exceeds the task's deadline."""
    code = "deadline_unmeetable"


class RateLimitedError(OverloadedError):
    """The client is over its rate limit."""
    code = "rate_limited"


class TooManyPendingError(OverloadedError):
    """The client holds too many unfinished tasks."""
    code = "too_many_pending"


class TooManyWaitsError(OverloadedError):
    """The client holds too many long-polls."""
    code = "too_many_waits"


class TooManyJobsError(OverloadedError):
    """The client has too many unfinished jobs."""
    code = "too_many_jobs"


# 500 and 503.
class InternalError(InternalServerError):
    """A bug in the gateway (it logged it)."""
    code = "internal_error"


class ServiceUnavailableError(UnavailableError):
    """Redis or Triton cannot be reached."""
    code = "unavailable"


class NotReplicatedError(UnavailableError):
    """Redis's replicas did not confirm the admission: nothing was queued."""
    code = "not_replicated"


class RedisOutOfMemoryError(UnavailableError):
    """Redis reached its ``maxmemory``: nothing was queued."""
    code = "redis_out_of_memory"


class CircuitOpenError(UnavailableError):
    """The model version is failing and has no fallback."""
    code = "circuit_open"


def _codes(base: type[FerryError]) -> dict[str, type[FerryError]]:
    found: dict[str, type[FerryError]] = {}
    for cls in base.__subclasses__():
        found |= _codes(cls)
        if "code" in vars(cls):
            found[cls.code] = cls
    return found


KINDS = (InvalidRequestError, AuthenticationError, PermissionDeniedError, NotFoundError,
         ConflictError, OverloadedError, InternalServerError, UnavailableError)
BY_CODE: Mapping[str, type[FerryError]] = {
    code: cls for kind in KINDS for code, cls in _codes(kind).items()}
BY_STATUS: Mapping[int, type[FerryError]] = {
    400: InvalidRequestError, 405: InvalidRequestError, 408: InvalidRequestError,
    413: InvalidRequestError, 415: InvalidRequestError, 422: InvalidRequestError,
    401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
    409: ConflictError, 429: OverloadedError, 500: InternalServerError, 503: UnavailableError}


def error_from_answer(status: int, body: Any, retry_after: float | None) -> FerryError:
    """The exception for an error answer: ``body`` is its parsed JSON (anything else is taken
    as no error body); the class is its code's, else its status's kind's, else FerryError."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {}
    code = str(error.get("code") or "")
    message = str(error.get("message") or f"HTTP {status}")
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    cls = BY_CODE.get(code) or BY_STATUS.get(status, FerryError)
    return cls(message, code=code or f"http_{status}", status=status,
               retry_after=retry_after, details=details)
