"""Request and response shapes, and the OpenAPI description of every route at /docs.

The two hot routes are served by ``gateway.hot`` outside FastAPI's routing, so their OpenAPI
entries are written here, from the same pydantic models, and merged into FastAPI's document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ferry.gateway.intake import MAX_ID_LENGTH, MAX_TIMEOUT_S, MAX_VERSION_DIGITS
from ferry.oip.schedule import MAX_TIMEOUT_US
from ferry.tasks.idempotency import MAX_KEY_LENGTH
from ferry.tensors import DATATYPES

REF = "#/components/schemas/{model}"
DATATYPE_NAMES: list[JsonValue] = [*sorted(DATATYPES)]


class _Options(BaseModel):
    """The fields both JSON forms of ``POST /v1/inference`` take beside their input."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH,
                              description="Triton model; default: ?model=, else the gateway's "
                              "default")
    client_id: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH,
                                  description="who is asking, for accounting; scopes "
                                  "Idempotency-Key")
    priority: Literal["high", "normal", "low"] | None = Field(
        None, description="higher boards and leaves first; default normal")
    callback_url: str | None = Field(None, description="POSTed the final record, signed "
                                     "(allowed hosts only); or the Ferry-Callback header")
    timeout_s: float | None = Field(None, gt=0, le=86400, description="deadline in seconds: "
                                    "the task ends EXPIRED rather than reach Triton later; "
                                    "X-Request-Timeout wins over it")


class InferenceRequest(_Options):
    """JSON form of ``POST /v1/inference`` (raw bodies are accepted too, by Content-Type)."""

    input: str | None = Field(None, description="text payload, sent to the model as UTF-8 bytes")
    input_base64: str | None = Field(None, description="binary payload (an image, say), base64")


class InferTensor(BaseModel):
    """An input tensor, as the Open Inference Protocol's JSON writes it."""

    name: str = Field(min_length=1)
    datatype: str = Field(json_schema_extra={"enum": DATATYPE_NAMES})
    shape: list[Annotated[int, Field(ge=0)]] = Field(description="the first dimension is the "
                                                     "request's rows for a batching model")
    data: Any = Field(None, description="the elements, flat or nested, row-major (BYTES as "
                      "strings)")
    parameters: dict[str, Any] | None = None


class RequestedTensor(BaseModel):
    """An output to answer with (none listed: every output)."""

    name: str = Field(min_length=1)
    parameters: dict[str, Any] | None = None


class InferParameters(BaseModel):
    """Triton's scheduling parameters; /v1's own (?priority=, X-Request-Timeout...) may be
    given instead, or as well if they agree."""

    model_config = ConfigDict(extra="forbid")

    priority: int = Field(0, ge=0, description="1 high; 0 (none) and 2 normal; 3 and more low")
    timeout: int = Field(0, ge=0, le=MAX_TIMEOUT_US, description="the deadline in microseconds; "
                         "0: none")
    binary_data_output: bool = Field(False, description="no effect: the record holds JSON")


class TensorInferenceRequest(_Options):
    """The tensor form of ``POST /v1/inference``: an infer request of the Open Inference
    Protocol (as ``POST /v2/models/{m}/infer`` takes it in JSON), told apart by ``inputs``; it
    is checked against the model's tensors, and its record's output is the protocol's answer."""

    inputs: list[InferTensor] = Field(min_length=1)
    outputs: list[RequestedTensor] | None = None
    id: str = Field("", description="the request's id, repeated in the answer")
    parameters: InferParameters | None = None


class Accepted(BaseModel):
    task_id: str = Field(description="128 random bits, hex")
    status_url: str


class TaskResult(BaseModel):
    task_id: str
    status: Literal["PENDING", "SUCCESS", "FAILED", "EXPIRED", "CANCELLED"]
    model: str
    model_version: str | None = None
    created_at: float = Field(description="Unix seconds when the gateway accepted the task")
    priority: Literal["high", "low"] | None = Field(None, description="absent: normal")
    deadline_at: float | None = Field(None, description="Unix seconds; set with a deadline")
    finished_at: float | None = None
    answered_by: str | None = Field(None, description="the fallback model that answered, "
                                    "when the model's circuit breaker was open")
    cache: Literal["hit"] | None = Field(None, description="answered from the result cache")
    collapsed_into: str | None = Field(None, description="the identical task whose inference "
                                       "this one shared")
    webhook: dict[str, Any] | None = Field(None, description="the webhook's outcome")
    output: Any = Field(None, description="the model's outputs by name, as JSON")
    error: str | None = None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


MODELS: tuple[type[BaseModel], ...] = (InferenceRequest, TensorInferenceRequest, Accepted,
                                       TaskResult, ErrorDetail, ErrorBody)
BINARY = {"schema": {"type": "string", "format": "binary"}}
RAW_TYPES_DOC = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/tiff",
                 "application/octet-stream")


def _json(model: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=model)}}}


def _errors(codes: dict[int, str]) -> dict[str, Any]:
    return {str(code): {"description": text, "content": _json("ErrorBody")}
            for code, text in codes.items()}


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


UNAUTHORIZED = {"description": "FERRY_AUTH is on and the credential is missing or not "
                "accepted", "content": _json("ErrorBody"),
                "headers": {"WWW-Authenticate": _header('Bearer realm="ferry"')}}
RATE_LIMIT_HEADERS = {name: _header(text) for name, text in (
    ("RateLimit-Limit", "the client's requests per minute (FERRY_AUTH on)"),
    ("RateLimit-Remaining", "requests the client may still send at once"),
    ("RateLimit-Reset", "seconds until the client's whole allowance is back"),
    ("RateLimit-Policy", "'<per minute>;w=60;burst=<burst>'"))}
LIMITED = {"description": "over the client's rate limit (rate_limited) or another limit (see "
           "the code); Retry-After says when to try again", "content": _json("ErrorBody"),
           "headers": {"Retry-After": _header("seconds"), **RATE_LIMIT_HEADERS}}
# Either credential, or none when FERRY_AUTH=none (the default of `make up`).
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}, {}]
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "an API key (FERRY_AUTH="
               "api_key) or a JWT (FERRY_AUTH=jwt)"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}

NAME_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}
# What a client does next with the task it was given: schemathesis' stateful phase follows these.
TASK_LINKS = {
    "GetResult": {"operationId": "result_v1_result__task_id__get",
                  "parameters": {"task_id": "$response.body#/task_id"},
                  "description": "the task's status and result"},
    "CancelTask": {"operationId": "cancel_v1_result__task_id__delete",
                   "parameters": {"task_id": "$response.body#/task_id"},
                   "description": "cancel the task while it has not reached Triton"},
}

TASK_ID_SCHEMA = {"type": "string", "pattern": "^[0-9a-f]{32}$",
                  "description": "32 hex digits, as POST returned it"}

SUBMIT_DOC: dict[str, Any] = {
    "summary": "Submit one request; returns a task id at once (or the result, with Prefer: wait)",
    "operationId": "submit_v1_inference_post",
    "parameters": [
        {"name": "model", "in": "query", "required": False, "schema": NAME_SCHEMA,
         "description": "model (a JSON body's 'model' wins)"},
        {"name": "version", "in": "query", "required": False,
         "schema": {"type": "string", "pattern": f"^[0-9]{{1,{MAX_VERSION_DIGITS}}}$"},
         "description": "the model version, for the tensor form only (another body with it: "
                        "400); none: the newest"},
        {"name": "priority", "in": "query", "required": False,
         "schema": {"type": "string", "enum": ["high", "normal", "low"]},
         "description": "priority (a JSON body's 'priority' wins)"},
        {"name": "client_id", "in": "query", "required": False, "schema": NAME_SCHEMA,
         "description": "who is asking, for any body (a JSON body's 'client_id' too: then both "
                        "alike); with FERRY_AUTH on, only the credential's client"},
        {"name": "Prefer", "in": "header", "required": False, "schema": {"type": "string"},
         "description": "RFC 7240 `wait=N` (N ≤ 30 s): answer 200 with the finished result if "
                        "it is ready within N seconds, else 202 as usual"},
        {"name": "X-Request-Timeout", "in": "header", "required": False,
         "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S},
         "description": "deadline in seconds (any body kind)"},
        {"name": "Idempotency-Key", "in": "header", "required": False,
         "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH,
                    "pattern": "^[ -~]+$"}, "description":
         "a repeat within 24 h (same client_id, same request) gets the first one's task"},
    ],
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"anyOf": [
            {"$ref": REF.format(model="InferenceRequest")},
            {"$ref": REF.format(model="TensorInferenceRequest")}]}},
        **dict.fromkeys(RAW_TYPES_DOC, BINARY),
        "text/plain": {"schema": {"type": "string"}},
    }},
    "responses": {
        "202": {"description": "accepted; poll status_url", "content": _json("Accepted"),
                "headers": {"Location": _header("the task's status_url"),
                            **RATE_LIMIT_HEADERS}, "links": TASK_LINKS},
        "200": {"description": "finished within the time asked for with Prefer: wait",
                "content": _json("TaskResult"), "links": TASK_LINKS,
                "headers": {"Location": _header("the task's status_url"),
                            "Preference-Applied": _header("wait=N")}},
        **_errors({400: "bad input, or a query parameter that is unknown (unknown_parameter), "
                        "repeated or invalid", 403: "client_id (body or query) names another "
                   "client than the credential", 404: "unknown model", 405: "method not allowed",
                   413: "body or image too large", 415: "unsupported Content-Type",
                   422: "model does not follow Ferry's contract, or an Idempotency-Key reused "
                        "with another request",
                   500: "a bug in the gateway (logged)",
                   503: "Redis or Triton unavailable, or the model's circuit breaker is open; "
                        "retry later (Retry-After)"}),
        "401": UNAUTHORIZED,
        "429": {**LIMITED, "description": "the client's rate limit, its unfinished tasks or "
                "open long-polls, the model's backlog, or a predicted wait past the deadline "
                "(the code says which); Retry-After says when to try again"},
    },
    "security": SECURITY,
}

CANCEL_DOC: dict[str, Any] = {
    "summary": "Cancel a task that has not reached Triton",
    "operationId": "cancel_v1_result__task_id__delete",
    "parameters": [
        {"name": "task_id", "in": "path", "required": True, "schema": TASK_ID_SCHEMA},
    ],
    "responses": {
        "200": {"description": "the record, CANCELLED", "content": _json("TaskResult")},
        **_errors({400: "a query parameter (the route takes none): unknown_parameter",
                   404: "unknown or expired task (or another client's)",
                   405: "method not allowed", 409: "already finished, or being inferred",
                   500: "a bug in the gateway (logged)",
                   503: "Redis unavailable; retry later"}),
        "401": UNAUTHORIZED,
        "429": LIMITED,
    },
    "security": SECURITY,
}

RESULT_DOC: dict[str, Any] = {
    "summary": "A task's status and result; ?wait= long-polls",
    "operationId": "result_v1_result__task_id__get",
    "parameters": [
        {"name": "task_id", "in": "path", "required": True, "schema": TASK_ID_SCHEMA},
        {"name": "wait", "in": "query", "required": False,
         "schema": {"type": "number", "minimum": 0, "maximum": 30, "default": 0},
         "description": "seconds to wait for a final status"},
    ],
    "responses": {
        "200": {"description": "the task's record", "content": _json("TaskResult")},
        **_errors({400: "'wait' out of range or not a number, or another query parameter "
                        "(unknown_parameter) or 'wait' twice",
                   404: "unknown or expired task (or another client's)",
                   405: "method not allowed", 500: "a bug in the gateway (logged)",
                   503: "Redis unavailable; retry later"}),
        "401": UNAUTHORIZED,
        "429": LIMITED,
    },
    "security": SECURITY,
}


def add_hot_route_docs(openapi: dict[str, Any]) -> dict[str, Any]:
    """Add the hot routes and the models they use to FastAPI's OpenAPI document."""
    openapi.setdefault("paths", {})["/v1/inference"] = {"post": SUBMIT_DOC}
    openapi["paths"]["/v1/result/{task_id}"] = {"get": RESULT_DOC, "delete": CANCEL_DOC}
    openapi.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    schemas = openapi["components"].setdefault("schemas", {})
    for model in MODELS:
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi
