"""Turning an HTTP request body into a payload for a model, or a 4xx that says what is wrong.

A JSON body is one of two forms, told apart by one rule: a top-level ``inputs`` makes it the
tensor form (an infer request of the Open Inference Protocol, checked against the model's
tensors later); any other is the payload form (``input`` or ``input_base64``), which refused
``inputs`` as an unknown field before the tensor form existed, so no body changes meaning.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, NoReturn

import orjson
from PIL import Image, UnidentifiedImageError

from ferry.errors import (
    BadRequestError,
    ClientError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)
from ferry.oip.request import read_infer_request
from ferry.oip.schedule import schedule
from ferry.priority import Priority
from ferry.submission import Submission, TensorForm, TensorSubmission
from ferry.tensors import TensorError

JSON_FIELDS = frozenset({"model", "input", "input_base64", "client_id", "priority", "timeout_s",
                         "callback_url", "model_version", "rollout_key"})
# ``POST /v1/inference``'s query parameters, for any body; any other is refused (gateway.query).
QUERY_PARAMETERS = frozenset({"model", "version", "priority", "client_id"})
RAW_TYPES = frozenset({"image/jpeg", "image/png", "image/webp", "image/bmp", "image/tiff",
                       "application/octet-stream", "text/plain"})
# Formats the bundled image model decodes (OpenCV): GIF, for one, it does not.
IMAGE_FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP", "BMP", "TIFF"})  # MPO: multi-frame JPEG
MAX_IMAGE_PIXELS = 50_000_000
MAX_ID_LENGTH = 256
MAX_TIMEOUT_S = 86400.0
TENSOR_FIELDS = frozenset({"inputs", "outputs", "id", "parameters"})  # the protocol's own
# The tensor form's fields: the protocol's, and the payload form's but for the payload.
TENSOR_FORM_FIELDS = TENSOR_FIELDS | (JSON_FIELDS - {"input", "input_base64"})
MAX_VERSION_DIGITS = 18  # any such number fits Triton's 64-bit version numbers


def media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it is known to exceed ``limit`` bytes."""
    too_big = PayloadTooLargeError("body_too_large",
                                   f"request body exceeds the limit of {limit} bytes")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for chunk in chunks:
        body.extend(chunk)
        if len(body) > limit:
            raise too_big
    return bytes(body)


def parse_submission(body: bytes, content_type: str, model_param: str | None,
                     query: Mapping[str, str] | None = None,
                     timeout_header: str | None = None) -> Submission:
    """A JSON document or a raw payload, by ``Content-Type``; the priority, timeout and client
    from the JSON fields, or ``?priority=``, the ``X-Request-Timeout`` header and
    ``?client_id=`` (any body kind)."""
    query = query or {}
    timeout = parse_timeout(timeout_header, "header X-Request-Timeout")
    priority = Priority.parse(query.get("priority"), "query.priority")
    asked_client = _clean_name(query.get("client_id"), "query.client_id", "invalid_parameter")
    if content_type == "application/json" or content_type.endswith("+json"):
        submission = _from_json(body, model_param, priority, query, timeout)
    elif content_type in RAW_TYPES:
        submission = _from_raw(body, content_type, model_param, priority)
    else:
        _refuse_media_type(content_type)
    version = _pinned(submission, query)
    client_id = _client(submission.client_id, asked_client)
    if version != submission.version or client_id != submission.client_id:
        submission = replace(submission, version=version, client_id=client_id)
    if timeout is not None:  # the tensor form has agreed its deadline with it already
        submission = replace(submission, timeout_s=timeout)
    return submission


def _pinned(submission: Submission, query: Mapping[str, str]) -> str:
    """The version a request pins: its ``model_version`` field or ``?version=`` (one, or both
    alike), '' for none."""
    named = submission.version
    if isinstance(submission, TensorSubmission):
        named = named or submission.tensors.version
    asked = _version(query.get("version"), "query.version")
    if named and asked and named != asked:
        raise BadRequestError("invalid_parameter", f"the model version is {named} by "
                              f"'model_version' and {asked} by query.version; set one, or both "
                              "alike")
    return named or asked


def _client(named: str, asked: str | None) -> str:
    """The client a request names: its ``client_id`` field or ``?client_id=`` (one, or both
    alike), '' for none (the credential's, with ``FERRY_AUTH`` on: ``Caller.client_for``)."""
    if asked is None:
        return named
    if named and named != asked:
        raise BadRequestError("invalid_parameter", f"the client is {named!r} by 'client_id' and "
                              f"{asked!r} by query.client_id; set one, or both alike")
    return asked


def parse_timeout(raw: str | float | None, where: str) -> float | None:
    """Seconds in (0, 86400], or a 400 naming ``where``."""
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except (ValueError, OverflowError):
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:  # NaN fails too
        shown = repr(raw[:40]) if isinstance(raw, str) else f"{raw!r}"[:40]  # as it was sent
        raise BadRequestError("invalid_timeout", f"{where} must be a number of seconds above 0 "
                              f"and at most {MAX_TIMEOUT_S:g}, not {shown}")
    return seconds


def _refuse_media_type(content_type: str) -> NoReturn:
    if not content_type:
        raise UnsupportedMediaTypeError(
            "unsupported_media_type", "missing Content-Type: send application/json or a raw "
            f"payload ({', '.join(sorted(RAW_TYPES))})")
    raise UnsupportedMediaTypeError(
        "unsupported_media_type", f"Content-Type {content_type!r} is not accepted; use "
        f"application/json or one of {', '.join(sorted(RAW_TYPES))}")


def _from_raw(body: bytes, content_type: str, model: str | None,
              priority: Priority) -> Submission:
    if not body:
        raise BadRequestError("empty_input", "the request body is empty: send the payload bytes")
    return Submission(model=_clean_name(model, "model"), payload=body, content_type=content_type,
                      priority=priority)


def _from_json(body: bytes, model_param: str | None, priority: Priority,
               query: Mapping[str, str], timeout: float | None) -> Submission:
    """The payload form; or the tensor form, for a document with ``inputs`` (which the payload
    form does not take: the rule costs the payload form nothing)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "surrogate in string" in str(exc):  # an escaped lone surrogate ("\\ud800")
            raise BadRequestError("invalid_text", "the JSON body holds characters that are not "
                                  f"valid Unicode (unpaired surrogates): {exc}") from None
        raise BadRequestError("malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequestError("malformed_json", "the JSON body must be an object")
    unknown = sorted(set(doc) - JSON_FIELDS)
    if unknown:
        if "inputs" in doc:
            return _from_tensor_json(doc, model_param, query, timeout)
        raise BadRequestError("unknown_field", f"unknown field(s) {unknown}; allowed: "
                              f"{sorted(JSON_FIELDS)}")
    named = _optional_str(doc, "model")
    model = _clean_name(named if named is not None else model_param, "model")
    client_id = _clean_name(_optional_str(doc, "client_id"), "client_id") or ""
    payload, content_type = _json_payload(doc)
    named_priority = _optional_str(doc, "priority")
    if named_priority is not None:
        priority = Priority.parse(named_priority, "'priority'")
    return Submission(model=model, payload=payload, content_type=content_type, client_id=client_id,
                      priority=priority, timeout_s=_json_timeout(doc),
                      callback_url=_optional_str(doc, "callback_url") or "",
                      version=_named_version(doc),
                      rollout_key=_clean_name(_optional_str(doc, "rollout_key"),
                                              "rollout_key") or "")


def _json_timeout(doc: dict[str, Any]) -> float | None:
    timeout = doc.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, int | float)):
        raise BadRequestError("invalid_timeout", "'timeout_s' must be a number of seconds, "
                              f"not {type(timeout).__name__}")
    return parse_timeout(timeout, "'timeout_s'")


def _from_tensor_json(doc: dict[str, Any], model_param: str | None, query: Mapping[str, str],
                      timeout: float | None) -> Submission:
    """The tensor form: the protocol's request, with ``/v1``'s fields and parameters beside
    it. Its priority and deadline are ``/v1``'s (as for a payload) or the request's
    ``priority`` and ``timeout`` parameters; where both are set they must agree."""
    unknown = sorted(set(doc) - TENSOR_FORM_FIELDS)
    if unknown:
        ambiguous = {"input", "input_base64"} & set(unknown)
        if ambiguous:
            raise BadRequestError("ambiguous_input", f"send either 'inputs' (tensors) or "
                                  f"{sorted(ambiguous)[0]!r} (a payload), not both")
        raise BadRequestError("unknown_field", f"unknown field(s) {unknown}; the tensor form "
                              f"takes {sorted(TENSOR_FORM_FIELDS)}")
    named = _optional_str(doc, "model")
    try:
        request = read_infer_request(doc)
        triton_priority, triton_timeout = schedule(request.parameters)
    except TensorError as exc:
        raise BadRequestError("invalid_tensors", str(exc)) from None
    named_timeout = _json_timeout(doc)
    return TensorSubmission(
        model=_clean_name(named if named is not None else model_param, "model"),
        payload=b"", content_type="",
        client_id=_clean_name(_optional_str(doc, "client_id"), "client_id") or "",
        priority=_agreed_priority(_ferry_priority(doc, query), triton_priority if
                                  request.parameters.get("priority") else None),  # 0: unset
        timeout_s=_agreed_timeout(timeout if timeout is not None else named_timeout,
                                  triton_timeout),
        callback_url=_optional_str(doc, "callback_url") or "",
        version=_named_version(doc),
        rollout_key=_clean_name(_optional_str(doc, "rollout_key"), "rollout_key") or "",
        tensors=TensorForm(request, _version(query.get("version"), "query.version")))


def _ferry_priority(doc: dict[str, Any], query: Mapping[str, str]) -> Priority | None:
    """The priority ``/v1`` names: the body's ``priority``, else ``?priority=``; None: none."""
    named = _optional_str(doc, "priority")
    if named is not None:
        return Priority.parse(named, "'priority'")
    raw = query.get("priority")
    return None if raw is None else Priority.parse(raw, "query.priority")


def _agreed_priority(ours: Priority | None, triton: Priority | None) -> Priority:
    """``/v1``'s priority or the request's ``priority`` parameter (its level as Ferry's), the
    one that is set; both set and different: a 400."""
    if ours is not None and triton is not None and ours is not triton:
        raise BadRequestError("invalid_priority", f"the priority is {ours.label} by /v1 "
                              f"('priority') and {triton.label} by the request's 'priority' "
                              "parameter; set one, or both alike")
    if ours is not None:
        return ours
    return triton if triton is not None else Priority.NORMAL


def _agreed_timeout(ours: float | None, triton: float | None) -> float | None:
    """``/v1``'s deadline or the request's ``timeout`` parameter, the one that is set; both set
    and different (to the microsecond): a 400."""
    if ours is not None and triton is not None and round(ours * 1e6) != round(triton * 1e6):
        raise BadRequestError("invalid_timeout", f"the deadline is {ours:g} s by /v1 "
                              f"(X-Request-Timeout or 'timeout_s') and {triton:g} s by the "
                              "request's 'timeout' parameter; set one, or both alike")
    return ours if ours is not None else triton


def _version(raw: str | None, where: str) -> str:
    """A version number, or '' for none (the rollout's version, or the model's newest)."""
    if raw is None:
        return ""
    if not (raw.isascii() and raw.isdigit() and 0 < len(raw) <= MAX_VERSION_DIGITS):
        raise BadRequestError("invalid_parameter", f"{where} must be a version number "
                              f"(1 to {MAX_VERSION_DIGITS} digits), not {raw[:40]!r}")
    return raw


def _named_version(doc: dict[str, Any]) -> str:
    value = doc.get("model_version")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if value is not None and not isinstance(value, str):
        raise BadRequestError("invalid_field", "'model_version' must be a version number "
                              f"(a string of digits), not {type(value).__name__}")
    return _version(value, "'model_version'")


def _json_payload(doc: dict[str, Any]) -> tuple[bytes, str]:
    text, encoded = _optional_str(doc, "input"), _optional_str(doc, "input_base64")
    if text is not None and encoded is not None:
        raise BadRequestError("ambiguous_input", "send either 'input' or 'input_base64', not both")
    if text is None and encoded is None:
        raise BadRequestError("missing_input", "the request has no 'input' (text) or "
                              "'input_base64' (binary payload)")
    if text is not None:
        if not text:
            raise BadRequestError("empty_input", "'input' is empty")
        return text.encode("utf-8"), "text/plain"  # orjson has refused unpaired surrogates
    assert encoded is not None
    try:
        payload = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequestError("invalid_base64", "'input_base64' is not valid base64") from None
    if not payload:
        raise BadRequestError("empty_input", "'input_base64' decodes to nothing")
    return payload, "application/octet-stream"


def _optional_str(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise BadRequestError("invalid_field", f"'{key}' must be a string, "
                              f"not {type(value).__name__}")
    return value


def _clean_name(value: str | None, what: str, code: str = "invalid_field") -> str | None:
    if value is None:
        return None
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise BadRequestError(code, f"'{what}' must be 1 to {MAX_ID_LENGTH} printable "
                              "characters")
    return value


def check_payload(kind: str, payload: bytes) -> None:
    """Refuse what the model cannot take, by the model's declared input kind."""
    if kind == "text":
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequestError("invalid_text", "this model takes UTF-8 text") from None
    elif kind == "image":
        check_image(payload)


def check_image(payload: bytes) -> None:
    """Decode the image fully (CPU work: call it in a thread)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(payload)) as image:
                if image.format not in IMAGE_FORMATS:
                    raise BadRequestError(
                        "undecodable_image", f"{image.format} images are not accepted; send "
                        f"one of {', '.join(sorted(IMAGE_FORMATS))}")
                if image.width * image.height > MAX_IMAGE_PIXELS:
                    raise PayloadTooLargeError("image_too_large", f"the image has more "
                                               f"than {MAX_IMAGE_PIXELS} pixels")
                image.load()
    except ClientError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise PayloadTooLargeError("image_too_large", f"the image has more than "
                                   f"{MAX_IMAGE_PIXELS} pixels") from None
    except UnidentifiedImageError:
        raise BadRequestError("undecodable_image", "the payload is not a decodable image in a "
                              f"known format ({', '.join(sorted(IMAGE_FORMATS))})") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise BadRequestError("undecodable_image",
                              f"the payload is not a decodable image: {exc}") from None
