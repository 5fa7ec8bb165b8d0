"""The kit's inputs: one photo as a JPEG of the model's size, made distinct per request.

Ferry's result cache and request collapsing key on a request's bytes, so a load of one image
repeated would measure the cache. Each copy here carries its own JPEG comment segment (COM,
0xFFFE) right after the start-of-image marker: the bytes differ, the pixels and the decoding
work do not.
"""

from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path

from PIL import Image

SOI = b"\xff\xd8"
COM = b"\xff\xfe"


def base_jpeg(source: Path, size: int, quality: int = 90) -> bytes:
    """``source`` resized to ``size`` by ``size`` RGB and encoded as a baseline JPEG."""
    with Image.open(source) as image:
        square = image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    square.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def variant(jpeg: bytes, index: int) -> bytes:
    """``jpeg`` with a comment segment naming ``index`` after its start-of-image marker."""
    if not jpeg.startswith(SOI):
        raise ValueError("not a JPEG: it does not start with the SOI marker")
    comment = f"ferry-kit {index:09d}".encode()
    return SOI + COM + struct.pack(">H", len(comment) + 2) + comment + jpeg[len(SOI):]


def serialized(element: bytes) -> bytes:
    """One BYTES element as Triton serializes a tensor of them."""
    return struct.pack("<I", len(element)) + element


def input_data(path: Path, jpeg: bytes, name: str, count: int, start: int = 0) -> Path:
    """A perf_analyzer ``--input-data`` file of ``count`` distinct copies of ``jpeg`` for the
    BYTES input ``name`` (``start`` keeps two files' copies apart). perf_analyzer takes a "b64"
    BYTES tensor as its serialized form: each element's length (4 bytes, little-endian), then
    the element."""
    data = [{name: {"b64": base64.b64encode(serialized(variant(jpeg, start + i))).decode()}}
            for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": data}))
    return path
