"""HTTP content codings of OIP bodies, gzip and deflate, as Triton and tritonclient use them.

"deflate" is the zlib format (RFC 9110: RFC 1950 around a deflate stream), as tritonclient
sends it; a bare deflate stream, which some clients send, is read too. A request body is
decoded up to a size limit, so a small compressed body cannot expand without bound.
"""

from __future__ import annotations

import gzip
import zlib

from ferry.oip.request import InferRequestError

CODINGS = ("gzip", "deflate")
_WBITS = {"gzip": (31,), "x-gzip": (31,), "deflate": (15, -15)}


class BodyTooLargeError(InferRequestError):
    """A request body that decodes to more than the limit (a 413)."""


def decode_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The body with every coding of its ``Content-Encoding`` undone, last applied first."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in _WBITS:
            raise InferRequestError(f"Content-Encoding {coding!r} is not supported (gzip, "
                                    "deflate or identity)")
        body = _inflate(body, coding, limit)
    return body


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    error: zlib.error | None = None
    for wbits in _WBITS[coding]:
        inflater = zlib.decompressobj(wbits)
        try:
            data = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            error = exc
            continue
        if len(data) > limit:
            raise BodyTooLargeError(f"the {coding} body decodes to more than {limit} bytes")
        if not inflater.eof or inflater.unused_data:
            raise InferRequestError(f"the {coding} body is truncated or has data after its end")
        return data
    raise InferRequestError(f"the body is not valid {coding}: {error}")


def accepted_coding(accept_encoding: str | None) -> str | None:
    """The coding to answer with for an ``Accept-Encoding`` header: gzip or deflate, the one
    the client weighs highest (gzip on a tie), or None for the body as it is."""
    weights: dict[str, float] = {}
    for part in (accept_encoding or "").split(","):
        coding, _, params = part.strip().partition(";")
        weights[coding.strip().lower()] = _quality(params)
    wildcard = weights.get("*", 0.0)
    best = max(CODINGS, key=lambda c: weights.get(c, wildcard))
    return best if weights.get(best, wildcard) > 0 else None


def _quality(params: str) -> float:
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def encode_body(body: bytes, coding: str | None) -> bytes:
    """The body in ``coding`` (gzip, deflate, or None for as it is)."""
    if coding == "gzip":
        return gzip.compress(body, mtime=0)
    if coding == "deflate":
        return zlib.compress(body)
    return body
