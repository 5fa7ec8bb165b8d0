"""Schemathesis hooks for the fuzz test (loaded by ``st`` through SCHEMATHESIS_HOOKS): how to send
a body documented as ``application/x-ndjson`` (a job's manifest), which it has no serializer for."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(_ctx: Any, value: Any) -> bytes:
    """The generated body as it is (bytes, for the documented binary string), else its text."""
    return value if isinstance(value, bytes) else str(value).encode()
