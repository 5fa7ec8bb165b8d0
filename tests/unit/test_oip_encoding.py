"""Content codings of OIP bodies: gzip and deflate as tritonclient sends them, decoded within
a size limit; the answer's coding chosen from Accept-Encoding."""

from __future__ import annotations

import gzip
import zlib

import pytest

from ferry.oip.encoding import BodyTooLargeError, accepted_coding, decode_body, encode_body
from ferry.oip.request import InferRequestError

BODY = b'{"inputs": []}' * 100


@pytest.mark.parametrize(("coding", "encoded"), [
    ("gzip", gzip.compress(BODY, mtime=0)),  # what tritonclient sends for gzip
    ("deflate", zlib.compress(BODY)),  # and for deflate: the zlib format
    ("deflate", zlib.compress(BODY, wbits=-15)),  # a bare deflate stream
    ("identity", BODY),
    (None, BODY),
    ("deflate, gzip", gzip.compress(zlib.compress(BODY), mtime=0)),
])
def test_a_coded_body_decodes(coding: str | None, encoded: bytes) -> None:
    assert decode_body(encoded, coding, limit=len(BODY)) == BODY


@pytest.mark.parametrize(("coding", "encoded", "error", "message"), [
    ("br", BODY, InferRequestError, "'br' is not supported"),
    ("gzip", b"not gzip", InferRequestError, "not valid gzip"),
    ("gzip", gzip.compress(BODY, mtime=0)[:-12], InferRequestError, "truncated"),
    ("gzip", gzip.compress(BODY, mtime=0), BodyTooLargeError, f"more than {len(BODY) - 1} bytes"),
])
def test_a_body_that_does_not_decode_says_why(coding: str, encoded: bytes,
                                              error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        decode_body(encoded, coding, limit=len(BODY) - 1 if error is BodyTooLargeError
                    else len(BODY))


@pytest.mark.parametrize(("accept", "coding"), [
    (None, None),
    ("", None),
    ("gzip", "gzip"),
    ("deflate", "deflate"),
    ("gzip, deflate", "gzip"),
    ("gzip;q=0.5, deflate", "deflate"),
    ("br, *;q=0.1", "gzip"),
    ("gzip;q=0, deflate;q=0", None),
    ("identity", None),
    ("br", None),
])
def test_the_answer_takes_the_coding_the_client_weighs_highest(accept: str | None,
                                                                 coding: str | None) -> None:
    assert accepted_coding(accept) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate", None])
def test_an_encoded_body_decodes_as_tritonclient_would(coding: str | None) -> None:
    encoded = encode_body(BODY, coding)
    if coding == "gzip":
        assert gzip.decompress(encoded) == BODY
    elif coding == "deflate":
        assert zlib.decompress(encoded) == BODY
    else:
        assert encoded == BODY
