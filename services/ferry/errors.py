"""Ferry's one exception hierarchy.

Redis and gRPC errors are translated into these at the adapter boundary; whether a failure is worth
retrying is decided here, by the class (and, for a Redis error reply, by ``redis_reply_error``),
and nowhere else.
"""

import math
import re

MAX_ECHO = 80  # characters of one word of a request shown back in an error message
MAX_MESSAGE = 1000  # characters of an error message
# Tried only where a word starts: a 100-character message is read once, not per character.
_LONG_WORD = re.compile(rf"(?<!\S)\S{{{MAX_ECHO + 1},}}")


def clip_echoes(message: str) -> str:
    """``message`` with every word over ``MAX_ECHO`` characters cut there (with an ellipsis),
    and the whole at most ``MAX_MESSAGE`` characters.

    Messages quote what a request sent (an id, a model name, a header value), and a request may
    send a 5,000-character id: it is answered with enough of it to recognise, never all of it.
    Ferry's own words are never that long.
    """
    if len(message) > MAX_ECHO:
        message = _LONG_WORD.sub(lambda word: word[0][:MAX_ECHO] + "…", message)
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "…"


class FerryError(Exception):
    """Base of every error Ferry raises on purpose."""


class StartupError(FerryError):
    """A process or dependency could not be started or reached at start-up."""


class ConfigError(FerryError):
    """A setting has a value Ferry cannot use."""


class ClientError(FerryError):
    """A request Ferry refuses, with the HTTP status that says why and a ``code`` naming the
    problem; each status has its own class, so that callers and metrics tell them apart."""

    status = 400

    def __init__(self, code: str, message: str) -> None:
        message = clip_echoes(message)
        super().__init__(message)
        self.code = code
        self.message = message

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers this refusal carries."""
        return []


class BadRequestError(ClientError):
    """400: the request is malformed or names something invalid."""


class UnauthorizedError(ClientError):
    """401: no credential, or one Ferry does not accept; ``WWW-Authenticate`` says which kind it
    takes (RFC 6750: ``error="invalid_token"`` when one was presented)."""

    status = 401

    def __init__(self, code: str, message: str, presented: bool = False) -> None:
        super().__init__(code, message)
        self.presented = presented

    def headers(self) -> list[tuple[bytes, bytes]]:
        challenge = b'Bearer realm="ferry"'
        if self.presented:
            challenge += b', error="invalid_token"'
        return [(b"www-authenticate", challenge)]


class ForbiddenError(ClientError):
    """403: authenticated, but the request asks for something the client may not do."""

    status = 403


class NotFoundError(ClientError):
    """404: no such task or model."""

    status = 404


class MethodNotAllowedError(ClientError):
    status = 405


class RequestTimeoutError(ClientError):
    """408: the client stopped sending its request (gateway/timeouts.py)."""

    status = 408


class ConflictError(ClientError):
    """409: the request conflicts with the task's state (it has already finished)."""

    status = 409


class PayloadTooLargeError(ClientError):
    status = 413


class UnsupportedMediaTypeError(ClientError):
    status = 415


class UnprocessableError(ClientError):
    """422: well-formed, but Ferry cannot act on it (an unusable model, a reused idempotency key
    with another body)."""

    status = 422


class TooManyRequestsError(ClientError):
    """429: over a limit now; ``retry_after_s`` says when trying again may succeed."""

    status = 429

    def __init__(self, code: str, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(code, message)
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", b"%d" % max(1, math.ceil(self.retry_after_s)))]


class RateLimitedError(TooManyRequestsError):
    """429 from a client's request rate limit, with the ``RateLimit-*`` headers of the IETF
    draft (draft-ietf-httpapi-ratelimit-headers): the limit, what is left now, and seconds until
    the full allowance is back."""

    def __init__(self, message: str, retry_after_s: float, headers: list[tuple[bytes, bytes]]
                 ) -> None:
        super().__init__("rate_limited", message, retry_after_s)
        self.limit_headers = headers

    def headers(self) -> list[tuple[bytes, bytes]]:
        return super().headers() + self.limit_headers


class ServiceUnavailableError(ClientError):
    """503 for a reason of Ferry's own (a model's circuit breaker is open), with Retry-After."""

    status = 503

    def __init__(self, code: str, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(code, message)
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", b"%d" % max(1, math.ceil(self.retry_after_s)))]


class DependencyUnavailableError(FerryError):
    """Redis or Triton cannot be reached right now (the request may succeed later)."""


class RedisError(FerryError):
    """A Redis command failed (Ferry's own, not the driver's: the adapters of both Redis
    clients, ``ferry.redis_conn`` for redis-py and ``ferry.resp`` for the lean one, translate
    every error into one of these). Whether to try again is the subclass's to say:
    ``RedisUnavailableError`` (yes) or ``RedisCommandError`` (no)."""

    @property
    def code(self) -> str:
        """The error reply's first word (``WRONGTYPE``, ``NOGROUP``, ``OOM``...)."""
        return str(self).split(" ", 1)[0]


class RedisUnavailableError(RedisError, DependencyUnavailableError):
    """Redis cannot serve now, and may later: an error reply that says "not now" (the command
    had no effect), or a connection that failed (``RedisConnectionError``)."""


class RedisConnectionError(RedisUnavailableError):
    """Redis could not be reached, the connection broke, or Redis did not answer in time: what
    the command did is unknown."""


class RedisOutOfMemoryError(RedisUnavailableError):
    """``OOM``: Redis is at ``maxmemory`` under ``noeviction`` and refuses writes (a script's
    first write is refused whole: nothing was written)."""


class RedisCommandError(RedisError):
    """Redis refused the command for good (``WRONGTYPE``, ``NOGROUP``, ``NOSCRIPT``, a script's
    error, ``ERR`` syntax...): the same command would be refused again."""


# Error replies that say "not now" rather than "never", by their first word: the command had no
# effect, and may succeed once Redis has loaded its data, a failover or a cluster's
# reconfiguration is over, or a long script has ended. Every other error reply is permanent.
REDIS_NOT_NOW = frozenset({"LOADING", "READONLY", "BUSY", "MASTERDOWN", "MISCONF", "TRYAGAIN",
                           "CLUSTERDOWN", "NOREPLICAS"})


def redis_reply_error(message: str) -> RedisError:
    """The error for a Redis error reply, ``message`` as Redis sent it: transient or permanent,
    decided here for both clients."""
    code = message.split(" ", 1)[0]
    if code == "OOM":
        return RedisOutOfMemoryError(message)
    if code in REDIS_NOT_NOW:
        return RedisUnavailableError(message)
    return RedisCommandError(message)


class BackendError(FerryError):
    """An inference call failed. ``code`` is the server's status when it answered (gRPC's name:
    ``NOT_FOUND``, ``INVALID_ARGUMENT``...), ``reason`` its own words (else the message)."""

    transient = False

    def __init__(self, message: str, *, code: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or message


class TransientBackendError(BackendError):
    """Worth retrying the same call: the server was unreachable, overloaded or timed out."""

    transient = True


class PermanentBackendError(BackendError):
    """The server answered and refused the call: retrying the same batch will fail again."""


class ModelContractError(PermanentBackendError):
    """The model does not follow Ferry's model contract (one BYTES input of dims [1], batched)."""


class UnknownModelError(PermanentBackendError):
    """Triton does not serve a model of that name (or it is not ready)."""
