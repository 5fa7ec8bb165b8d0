"""Turning a request body into a submission, or a 4xx with a code."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from collections.abc import AsyncIterator

import orjson
import pytest
from PIL import Image

from ferry.errors import ClientError
from ferry.gateway.intake import (
    MAX_ID_LENGTH,
    RAW_TYPES,
    check_image,
    check_payload,
    media_type,
    parse_submission,
    read_body,
)
from ferry.priority import Priority
from ferry.submission import Submission

JSON = "application/json"


def image_bytes(fmt: str, size: tuple[int, int] = (32, 24)) -> bytes:
    """A small image with some detail (so a truncated copy is missing real data)."""
    image = Image.new("RGB", size)
    image.putdata([((x * 7) % 256, (y * 11) % 256, (x * y) % 256)
                   for y in range(size[1]) for x in range(size[0])])
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def png_claiming_size(width: int, height: int) -> bytes:
    """A tiny valid PNG whose header is rewritten to claim ``width`` x ``height`` pixels."""
    data = bytearray(image_bytes("PNG", (1, 1)))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def refused(body: bytes, content_type: str, model: str | None = None) -> ClientError:
    with pytest.raises(ClientError) as info:
        parse_submission(body, content_type, model)
    return info.value


def payload_refused(kind: str, payload: bytes) -> ClientError:
    with pytest.raises(ClientError) as info:
        check_payload(kind, payload)
    return info.value


async def stream(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def must_not_be_read() -> AsyncIterator[bytes]:
    raise AssertionError("the body was read although its declared length is too large")
    yield b""  # pragma: no cover - makes this an async generator


# --- media_type ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, ""),
        ("", ""),
        ("application/json", "application/json"),
        ("Application/JSON; charset=utf-8", "application/json"),
        ("  text/plain ;charset=latin-1", "text/plain"),
    ],
)
def test_media_type(header: str | None, expected: str) -> None:
    assert media_type(header) == expected


# --- JSON bodies --------------------------------------------------------------------------------


def test_json_text_input() -> None:
    submission = parse_submission(b'{"input": "hello"}', JSON, None)
    assert submission == Submission(model=None, payload=b"hello", content_type="text/plain",
                                    client_id="")


def test_json_text_input_is_utf8_encoded() -> None:
    submission = parse_submission('{"input": "caf\u00e9 \u2603"}'.encode(), JSON, None)
    assert submission.payload == "caf\u00e9 \u2603".encode()


def test_json_base64_input() -> None:
    body = b'{"input_base64": "' + base64.b64encode(b"\x00\x01\xff") + b'"}'
    submission = parse_submission(body, JSON, None)
    assert submission == Submission(model=None, payload=b"\x00\x01\xff",
                                    content_type="application/octet-stream", client_id="")


def test_json_model_and_client_id() -> None:
    body = b'{"model": "sim", "input": "x", "client_id": "c-1"}'
    submission = parse_submission(body, JSON, None)
    assert submission.model == "sim"
    assert submission.client_id == "c-1"


def test_json_model_falls_back_to_query_parameter() -> None:
    assert parse_submission(b'{"input": "x"}', JSON, "sim").model == "sim"
    assert parse_submission(b'{"input": "x", "model": null}', JSON, "sim").model == "sim"


def test_json_model_field_wins_over_query_parameter() -> None:
    assert parse_submission(b'{"input": "x", "model": "a"}', JSON, "b").model == "a"


def test_structured_json_suffix_is_json() -> None:
    submission = parse_submission(b'{"input": "x"}', "application/vnd.ferry+json", None)
    assert submission.payload == b"x"
    assert submission.content_type == "text/plain"


@pytest.mark.parametrize("body", [b"{", b"", b"{'input': 'x'}", b"\xff\xfe{", b"input=x"])
def test_malformed_json(body: bytes) -> None:
    error = refused(body, JSON)
    assert (error.code, error.status) == ("malformed_json", 400)
    assert error.message.startswith("the body is not valid JSON")


@pytest.mark.parametrize("body", [b"[]", b'["x"]', b'"x"', b"42", b"null"])
def test_json_not_an_object(body: bytes) -> None:
    error = refused(body, JSON)
    assert (error.code, error.status) == ("malformed_json", 400)
    assert error.message == "the JSON body must be an object"


def test_unknown_fields() -> None:
    error = refused(b'{"input": "x", "prompt": "y", "extra": 1}', JSON)
    assert (error.code, error.status) == ("unknown_field", 400)
    assert "['extra', 'prompt']" in error.message


def test_both_inputs_are_ambiguous() -> None:
    error = refused(b'{"input": "x", "input_base64": "eA=="}', JSON)
    assert (error.code, error.status) == ("ambiguous_input", 400)


@pytest.mark.parametrize("body", [b"{}", b'{"model": "sim"}', b'{"input": null}'])
def test_missing_input(body: bytes) -> None:
    error = refused(body, JSON)
    assert (error.code, error.status) == ("missing_input", 400)


@pytest.mark.parametrize("body", [b'{"input": ""}', b'{"input_base64": ""}'])
def test_empty_input(body: bytes) -> None:
    error = refused(body, JSON)
    assert (error.code, error.status) == ("empty_input", 400)


@pytest.mark.parametrize("encoded", ["not base64!", "eA", "e===", "eA==\n", "****"])
def test_invalid_base64(encoded: str) -> None:
    error = refused(b'{"input_base64": "' + encoded.encode().replace(b"\n", b"\\n") + b'"}',
                    JSON)
    assert (error.code, error.status) == ("invalid_base64", 400)


@pytest.mark.parametrize(
    ("body", "field", "kind"),
    [
        (b'{"model": 5, "input": "x"}', "model", "int"),
        (b'{"model": ["sim"], "input": "x"}', "model", "list"),
        (b'{"input": 1}', "input", "int"),
        (b'{"input_base64": {"a": 1}}', "input_base64", "dict"),
        (b'{"input": "x", "client_id": true}', "client_id", "bool"),
    ],
)
def test_non_string_fields(body: bytes, field: str, kind: str) -> None:
    error = refused(body, JSON)
    assert (error.code, error.status) == ("invalid_field", 400)
    assert error.message == f"'{field}' must be a string, not {kind}"


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "' + b"m" * (MAX_ID_LENGTH + 1) + b'", "input": "x"}',
        b'{"model": "a\\nb", "input": "x"}',
        b'{"client_id": "", "input": "x"}',
        b'{"client_id": "tab\\there", "input": "x"}',
    ],
)
def test_bad_names(body: bytes) -> None:
    error = refused(body, JSON)
    assert (error.code, error.status) == ("invalid_field", 400)


def test_longest_allowed_name() -> None:
    name = "m" * MAX_ID_LENGTH
    assert parse_submission(b'{"input": "x"}', JSON, name).model == name


# --- raw bodies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream",
                                          "image/jpeg", "image/png", "image/webp"])
def test_raw_payload(content_type: str) -> None:
    submission = parse_submission(b"\x00raw bytes", content_type, "sim")
    assert submission == Submission(model="sim", payload=b"\x00raw bytes",
                                    content_type=content_type, client_id="")


def test_raw_payload_without_model() -> None:
    assert parse_submission(b"hi", "text/plain", None).model is None


def test_raw_types_include_the_documented_ones() -> None:
    assert {"text/plain", "application/octet-stream", "image/jpeg"} <= RAW_TYPES


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream", "image/jpeg"])
def test_empty_raw_body(content_type: str) -> None:
    error = refused(b"", content_type)
    assert (error.code, error.status) == ("empty_input", 400)


def test_raw_bad_model_parameter() -> None:
    error = refused(b"x", "text/plain", "")
    assert (error.code, error.status) == ("invalid_field", 400)


def test_missing_content_type() -> None:
    error = refused(b'{"input": "x"}', "")
    assert (error.code, error.status) == ("unsupported_media_type", 415)
    assert error.message.startswith("missing Content-Type")


@pytest.mark.parametrize("content_type", ["multipart/form-data", "image/gif", "text/html",
                                          "application/x-www-form-urlencoded"])
def test_unsupported_content_type(content_type: str) -> None:
    error = refused(b"x", content_type)
    assert (error.code, error.status) == ("unsupported_media_type", 415)
    assert repr(content_type) in error.message


# --- read_body ----------------------------------------------------------------------------------


async def test_read_body_joins_chunks() -> None:
    assert await read_body(stream(b"ab", b"", b"cd"), None, 10) == b"abcd"


async def test_read_body_exactly_at_limit() -> None:
    assert await read_body(stream(b"12345", b"67890"), "10", 10) == b"1234567890"


async def test_read_body_empty() -> None:
    assert await read_body(stream(), "0", 10) == b""


async def test_read_body_refuses_declared_length_over_limit_without_reading() -> None:
    with pytest.raises(ClientError) as info:
        await read_body(must_not_be_read(), "11", 10)
    assert (info.value.code, info.value.status) == ("body_too_large", 413)
    assert info.value.message == "request body exceeds the limit of 10 bytes"


async def test_read_body_refuses_streamed_body_over_limit() -> None:
    with pytest.raises(ClientError) as info:
        await read_body(stream(b"12345", b"678901"), None, 10)
    assert (info.value.code, info.value.status) == ("body_too_large", 413)


async def test_read_body_refuses_body_longer_than_declared_length() -> None:
    with pytest.raises(ClientError) as info:
        await read_body(stream(b"x" * 6, b"x" * 6), "3", 10)
    assert (info.value.code, info.value.status) == ("body_too_large", 413)


async def test_read_body_ignores_a_non_numeric_declared_length() -> None:
    assert await read_body(stream(b"abc"), "lots", 10) == b"abc"


async def test_read_body_stops_at_the_first_chunk_over_the_limit() -> None:
    consumed: list[bytes] = []

    async def chunks() -> AsyncIterator[bytes]:
        for part in (b"x" * 8, b"x" * 8, b"never"):
            consumed.append(part)
            yield part

    with pytest.raises(ClientError):
        await read_body(chunks(), None, 10)
    assert consumed == [b"x" * 8, b"x" * 8]


# --- check_payload ------------------------------------------------------------------------------


def test_text_accepts_utf8() -> None:
    check_payload("text", "caf\u00e9".encode())


@pytest.mark.parametrize("payload", [b"\xff", b"caf\xe9", b"\xc3"])
def test_text_refuses_invalid_utf8(payload: bytes) -> None:
    error = payload_refused("text", payload)
    assert (error.code, error.status) == ("invalid_text", 400)


def test_bytes_kind_accepts_anything() -> None:
    check_payload("bytes", b"\xff\x00 not an image, not text")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "WEBP", "TIFF"])
def test_image_accepts_supported_formats(fmt: str) -> None:
    check_payload("image", image_bytes(fmt))


def test_image_refuses_garbage() -> None:
    error = payload_refused("image", b"definitely not an image")
    assert (error.code, error.status) == ("undecodable_image", 400)
    assert error.message.startswith("the payload is not a decodable image")


def test_image_refuses_gif() -> None:
    error = payload_refused("image", image_bytes("GIF"))
    assert (error.code, error.status) == ("undecodable_image", 400)
    assert error.message.startswith("GIF images are not accepted")


def test_image_refuses_truncated_jpeg() -> None:
    jpeg = image_bytes("JPEG", (64, 64))
    error = payload_refused("image", jpeg[: len(jpeg) // 2])
    assert (error.code, error.status) == ("undecodable_image", 400)


def test_image_refuses_header_only_png() -> None:
    error = payload_refused("image", image_bytes("PNG")[:40])
    assert (error.code, error.status) == ("undecodable_image", 400)


def test_image_refuses_too_many_pixels_before_decoding() -> None:
    error = payload_refused("image", png_claiming_size(8000, 7500))  # 60 M pixels
    assert (error.code, error.status) == ("image_too_large", 413)


def test_text_kind_does_not_check_images() -> None:
    check_payload("text", b"GIF89a")


def test_check_image_directly() -> None:
    check_image(image_bytes("PNG"))
    with pytest.raises(ClientError) as info:
        check_image(b"")
    assert info.value.code == "undecodable_image"


# -- regressions: each of these once produced a 5xx or the wrong answer ---------------------------


def test_unpaired_surrogate_in_text_is_a_400() -> None:
    with pytest.raises(ClientError) as info:
        parse_submission(b'{"input": "\\ud800"}', "application/json", None)
    assert (info.value.code, info.value.status) == ("invalid_text", 400)


def test_deeply_nested_json_is_a_400() -> None:
    with pytest.raises(ClientError) as info:
        parse_submission(b"[" * 100_000, "application/json", None)
    assert (info.value.code, info.value.status) == ("malformed_json", 400)


def test_empty_model_in_json_is_refused_not_replaced() -> None:
    with pytest.raises(ClientError) as info:
        parse_submission(b'{"model": "", "input": "x"}', "application/json", "sim")
    assert info.value.code == "invalid_field"


def test_multi_frame_jpeg_is_accepted() -> None:
    frames = [Image.new("RGB", (16, 16), colour) for colour in ("red", "blue")]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="MPO", save_all=True, append_images=frames[1:])
    check_payload("image", buffer.getvalue())


def test_image_past_pillows_own_bomb_limit_is_a_413() -> None:
    buffer = io.BytesIO()
    Image.new("1", (12_000, 10_000)).save(buffer, format="PNG")  # 120 M pixels, tiny file
    with pytest.raises(ClientError) as info:
        check_payload("image", buffer.getvalue())
    assert (info.value.code, info.value.status) == ("image_too_large", 413)


# --- priority and deadline ------------------------------------------------------------------------


def test_priority_and_timeout_from_json() -> None:
    submission = parse_submission(b'{"input": "x", "priority": "high", "timeout_s": 2.5}',
                                  JSON, None)
    assert (submission.priority, submission.timeout_s) == (Priority.HIGH, 2.5)
    assert parse_submission(b'{"input": "x"}', JSON, None).priority is Priority.NORMAL
    assert parse_submission(b'{"input": "x"}', JSON, None).timeout_s is None


def test_priority_from_the_query_and_timeout_from_the_header_for_raw_bodies() -> None:
    submission = parse_submission(b"abc", "application/octet-stream", None,
                                  {"priority": "low"}, "0.75")
    assert (submission.priority, submission.timeout_s) == (Priority.LOW, 0.75)


def test_json_priority_wins_over_the_query_and_the_header_over_timeout_s() -> None:
    submission = parse_submission(b'{"input": "x", "priority": "low", "timeout_s": 9}', JSON,
                                  None, {"priority": "high"}, "3")
    assert (submission.priority, submission.timeout_s) == (Priority.LOW, 3.0)


@pytest.mark.parametrize(
    ("body", "query", "header", "code", "names"),
    [
        (b'{"input": "x", "priority": "urgent"}', {}, None, "invalid_priority", "'priority'"),
        (b'{"input": "x", "priority": 1}', {}, None, "invalid_field", "'priority'"),
        (b'{"input": "x"}', {"priority": ""}, None, "invalid_priority", "query.priority"),
        (b'{"input": "x", "timeout_s": 0}', {}, None, "invalid_timeout", "'timeout_s'"),
        (b'{"input": "x", "timeout_s": -1}', {}, None, "invalid_timeout", "at most 86400, not -1"),
        (b'{"input": "x", "timeout_s": 0.0}', {}, None, "invalid_timeout", ", not 0.0"),
        (b'{"input": "x", "timeout_s": "5"}', {}, None, "invalid_timeout", "'timeout_s'"),
        (b'{"input": "x", "timeout_s": true}', {}, None, "invalid_timeout", "'timeout_s'"),
        (b'{"input": "x", "timeout_s": 1e400}', {}, None, "malformed_json", ""),
        (b'{"input": "x", "timeout_s": 86401}', {}, None, "invalid_timeout", ", not 86401"),
        (b'{"input": "x", "timeout_s": ' + b"9" * 5000 + b"}", {}, None, "malformed_json", ""),
        (b'{"input": "x"}', {}, "soon", "invalid_timeout", "X-Request-Timeout"),
        (b'{"input": "x"}', {}, "nan", "invalid_timeout", "X-Request-Timeout"),
        (b'{"input": "x"}', {}, "inf", "invalid_timeout", "X-Request-Timeout"),
    ],
)
def test_bad_priority_or_timeout_is_a_400_naming_it(body: bytes, query: dict[str, str],
                                                    header: str | None, code: str,
                                                    names: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_submission(body, JSON, None, query, header)
    assert (info.value.status, info.value.code) == (400, code)
    assert names in info.value.message


# --- ?client_id= ----------------------------------------------------------------------------


TENSOR_BODY = (b'{"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1], '
               b'"data": ["x"]}]}')


@pytest.mark.parametrize(("body", "content_type"), [
    (b"abc", "application/octet-stream"), (b"abc", "text/plain"), (b'{"input": "x"}', JSON),
    (TENSOR_BODY, JSON), (b'{"input": "x", "client_id": "c-1"}', JSON)])
def test_the_query_names_the_client_for_any_body(body: bytes, content_type: str) -> None:
    submission = parse_submission(body, content_type, "sim", {"client_id": "c-1"})
    assert submission.client_id == "c-1"


def test_no_client_named_is_anonymous() -> None:
    assert parse_submission(b"abc", "application/octet-stream", "sim", {}).client_id == ""


@pytest.mark.parametrize("value", ["", "x" * (MAX_ID_LENGTH + 1), "a\nb", "\x00"])
def test_a_bad_client_id_in_the_query_is_refused_as_the_jsons_is(value: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_submission(b"abc", "application/octet-stream", "sim", {"client_id": value})
    assert (info.value.status, info.value.code) == (400, "invalid_parameter")
    assert "query.client_id" in info.value.message
    json_refusal = refused(orjson.dumps({"input": "x", "client_id": value}), JSON)
    assert info.value.message.replace("query.client_id", "client_id") == json_refusal.message


@pytest.mark.parametrize("body", [b'{"input": "x", "client_id": "alice"}',
                                  TENSOR_BODY[:-1] + b', "client_id": "alice"}'])
def test_two_different_clients_named_are_refused(body: bytes) -> None:
    with pytest.raises(ClientError) as info:
        parse_submission(body, JSON, "sim", {"client_id": "bob"})
    assert (info.value.status, info.value.code) == (400, "invalid_parameter")
    assert "'alice'" in info.value.message and "'bob'" in info.value.message


@pytest.mark.parametrize("value", ["high", "HIGH", "High", "normal", "low"])
def test_priority_names_are_case_insensitive(value: str) -> None:
    assert Priority.parse(value, "x").label == value.lower()


def test_envelope_priorities_clamp() -> None:
    assert Priority.of(7) is Priority.HIGH
    assert Priority.of(-3) is Priority.BATCH
    assert Priority.of(-2) is Priority.BATCH
    assert Priority.of(-1) is Priority.LOW
    assert Priority.of(0) is Priority.NORMAL
