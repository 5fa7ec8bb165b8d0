"""The two routes every task takes, served as plain ASGI in front of FastAPI.

``POST /v1/inference`` and ``GET /v1/result/{task_id}`` carry every task, so they do not pay for
machinery they do not use: no dependency injection, no middleware stack, no response model
validation. Everything else (docs, health, metrics) goes on to FastAPI, which also documents these
two routes (see ``schemas.hot_route_docs``). Errors have the API's one error body.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import orjson
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from ferry.access import ANONYMOUS, Caller
from ferry.compose.gateway import GatewayParts
from ferry.errors import (
    BadRequestError,
    ClientError,
    DependencyUnavailableError,
    RequestTimeoutError,
)
from ferry.gateway.intake import QUERY_PARAMETERS, media_type, parse_submission, read_body
from ferry.gateway.query import parse_query
from ferry.gateway.service import Gateway
from ferry.gateway.timeouts import TIMED_OUT
from ferry.redis_conn import unavailable
from ferry.tasks.idempotency import MAX_KEY_LENGTH, parse_idempotency_key
from ferry.telemetry.metrics import GatewayMetrics
from ferry.webhooks import check_callback

log = logging.getLogger(__name__)

SUBMIT_PATH = "/v1/inference"
RESULT_PREFIX = "/v1/result/"
RESULT_ROUTE = "/v1/result/{task_id}"
# Each route's query parameters (any other is a 400) and its name in that refusal.
SUBMIT_QUERY = (QUERY_PARAMETERS, f"POST {SUBMIT_PATH}")
RESULT_QUERY = (frozenset({"wait"}), f"GET {RESULT_ROUTE}")
CANCEL_QUERY: tuple[frozenset[str], str] = (frozenset(), f"DELETE {RESULT_ROUTE}")

Headers = list[tuple[bytes, bytes]]
Answer = tuple[int, bytes, Headers]
HeaderValues = dict[bytes, list[bytes]]
Handler = Callable[[Scope, Receive, HeaderValues, Caller], Awaitable[Answer]]
JSON_TYPE = (b"content-type", b"application/json")


@dataclass(frozen=True)
class Route:
    template: str  # as metrics label it
    handlers: dict[str, Handler]  # by method

    @property
    def allow(self) -> str:
        return ", ".join(self.handlers)


def error_body(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


def prefer_wait(values: list[bytes], limit: float) -> float:
    """Seconds asked for by ``Prefer: wait=N`` (RFC 7240), at most ``limit``; 0 if not asked.

    Preferences are hints: one that cannot be read is ignored, as the RFC says.
    """
    for value in values:
        for preference in value.decode("latin-1").split(","):
            name, _, rest = preference.split(";", 1)[0].partition("=")
            if name.strip().lower() != "wait":
                continue
            try:
                seconds = float(rest.strip().strip('"'))
            except ValueError:
                continue
            if not math.isnan(seconds) and seconds > 0:
                return min(seconds, limit)
    return 0.0


def no_cache(values: list[bytes]) -> bool:
    """Whether ``Cache-Control`` asks for a fresh answer (``no-cache``)."""
    return any(directive.strip().split(b"=", 1)[0].lower() == b"no-cache"
               for value in values for directive in value.split(b","))


def parse_wait(raw: str | None) -> float:
    if raw is None:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise BadRequestError("invalid_parameter",
                              f"query.wait: {raw!r} is not a number of seconds") from None


def went_away(scope: Scope) -> ClientError:
    """The error of a request whose client went away before sending its whole body, or whose
    body stalled past its timeout (the connection was closed on it: ``gateway.timeouts``)."""
    timed_out = scope.get(TIMED_OUT)
    if timed_out:
        return RequestTimeoutError(timed_out, "the request body stalled; the connection was "
                                   "closed")
    return BadRequestError("incomplete_body", "the client went away before sending its whole "
                           "body")


async def _chunks(scope: Scope, receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise went_away(scope)
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


class HotLane:
    """Serves the hot routes itself and hands every other request (and the lifespan) to
    ``fallback``, the FastAPI app."""

    def __init__(self, gateway: Gateway, parts: GatewayParts, fallback: FastAPI) -> None:
        self.gateway = gateway
        self.fallback = fallback
        self.settings = parts.settings
        self.metrics: GatewayMetrics = parts.metrics
        self.access = parts.access
        self.tracing = parts.tracing
        self.submit = Route(SUBMIT_PATH, {"POST": self._submit})
        self.result = Route(RESULT_ROUTE, {"GET": self._result, "DELETE": self._cancel})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        if route is None:
            await self.fallback(scope, receive, send)
        else:
            await self._serve(route, scope, receive, send)

    def _route(self, scope: Scope) -> Route | None:
        if scope["type"] != "http":
            return None
        path: str = scope["path"]
        if path == SUBMIT_PATH:
            return self.submit
        if path.startswith(RESULT_PREFIX) and "/" not in path[len(RESULT_PREFIX):]:
            return self.result
        return None

    async def _serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        handler = route.handlers.get(scope["method"])
        if handler is None:
            status, body, headers = 405, error_body(
                "method_not_allowed", f"{route.template} takes {route.allow} only"), [
                (b"allow", route.allow.encode())]
        elif self.tracing.enabled:
            status, body, headers = await self._traced(route, handler, scope, receive)
        else:
            status, body, headers = await self._answer(handler, scope, receive)
        headers.append(JSON_TYPE)
        headers.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.metrics.observe_request(route.template, scope["method"], status,
                                     time.perf_counter() - started)

    async def _traced(self, route: Route, handler: Handler, scope: Scope,
                      receive: Receive) -> Answer:
        """The answer, inside the request's span (the caller's traceparent, if any, its
        parent); the task it creates carries the span's context in its envelope."""
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"]
                   if name.lower() in (b"traceparent", b"tracestate")}
        with self.tracing.server_span(f"{scope['method']} {route.template}", carrier) as span:
            answer = await self._answer(handler, scope, receive)
            if span is not None:
                span.set_attribute("http.request.method", scope["method"])
                span.set_attribute("http.route", route.template)
                span.set_attribute("http.response.status_code", answer[0])
            return answer

    async def _answer(self, handler: Handler, scope: Scope, receive: Receive) -> Answer:
        """The handler's answer for an authenticated caller (with its ``RateLimit-*``
        headers), or the error's."""
        caller = ANONYMOUS
        try:
            headers = _header_values(scope)
            caller = await self.access.check(_last(headers, b"authorization"),
                                             _last(headers, b"x-api-key"))
            status, body, answer_headers = await handler(scope, receive, headers, caller)
        except ClientError as exc:
            self.metrics.rejected.labels(str(exc.status), exc.code).inc()
            status, body, answer_headers = (exc.status, error_body(exc.code, exc.message),
                                            exc.headers())
        except DependencyUnavailableError as exc:
            code, message = unavailable(exc)
            self.metrics.rejected.labels("503", code).inc()
            status, body, answer_headers = 503, error_body(code, message), [
                (b"retry-after", b"1")]
        except Exception:
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            status, body, answer_headers = 500, error_body(
                "internal_error", "the gateway failed to serve this request; the error is "
                "logged"), []
        if caller.headers and status != 429:
            answer_headers += caller.headers
        return status, body, answer_headers

    async def _submit(self, scope: Scope, receive: Receive, headers: HeaderValues,
                      caller: Caller) -> Answer:
        query = parse_query(scope["query_string"], *SUBMIT_QUERY)
        body = await read_body(_chunks(scope, receive), _last(headers, b"content-length"),
                               self.settings.max_body_bytes)
        submission = parse_submission(body, media_type(_last(headers, b"content-type")),
                                      query.get("model"), query,
                                      _last(headers, b"x-request-timeout"))
        if no_cache(headers.get(b"cache-control", [])):
            submission = replace(submission, no_cache=True)
        rollout_key = _last(headers, b"x-rollout-key")
        if rollout_key:
            if len(rollout_key) > MAX_KEY_LENGTH or not rollout_key.isprintable():
                raise BadRequestError("invalid_header", "X-Rollout-Key must be 1 to "
                                      f"{MAX_KEY_LENGTH} printable characters")
            submission = replace(submission, rollout_key=rollout_key)
        callback = _last(headers, b"ferry-callback") or submission.callback_url
        if callback:
            submission = replace(submission, callback_url=check_callback(
                callback, self.settings.webhook_hosts))
        wait = prefer_wait(headers.get(b"prefer", []), self.settings.max_poll_s)
        key = parse_idempotency_key(_last(headers, b"idempotency-key"))
        submitted = await self.gateway.submit(submission, wait, key, caller)
        task_id, record = submitted.task_id, submitted.record
        status_url = f"{RESULT_PREFIX}{task_id}"
        answer_headers: Headers = [(b"location", status_url.encode())]
        if wait:
            answer_headers.append((b"preference-applied", b"wait=%d" % max(1, round(wait))))
        if submitted.replayed:
            answer_headers.append((b"idempotent-replayed", b"true"))
        if record is not None:
            return 200, record.body, answer_headers
        return 202, orjson.dumps({"task_id": task_id, "status_url": status_url}), answer_headers

    async def _result(self, scope: Scope, receive: Receive, headers: HeaderValues,
                      caller: Caller) -> Answer:
        task_id = scope["path"][len(RESULT_PREFIX):]
        query = parse_query(scope["query_string"], *RESULT_QUERY)
        record = await self.gateway.result(task_id, parse_wait(query.get("wait")), caller)
        return 200, record.body, []

    async def _cancel(self, scope: Scope, receive: Receive, headers: HeaderValues,
                      caller: Caller) -> Answer:
        parse_query(scope["query_string"], *CANCEL_QUERY)
        await _no_body(scope, receive)
        record = await self.gateway.cancel(scope["path"][len(RESULT_PREFIX):], caller)
        return 200, record.body, []


async def _no_body(scope: Scope, receive: Receive) -> None:
    """Drain a request body nobody reads (a DELETE with one)."""
    async for _ in _chunks(scope, receive):
        pass


def _header_values(scope: Scope) -> HeaderValues:
    values: dict[bytes, list[bytes]] = {}
    for name, value in scope["headers"]:
        values.setdefault(name.lower(), []).append(value)
    return values


def _last(headers: HeaderValues, name: bytes) -> str | None:
    values = headers.get(name)
    return values[-1].decode("latin-1") if values else None
