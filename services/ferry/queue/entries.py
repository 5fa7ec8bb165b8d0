"""A partition stream's entries as a batcher receives them: their fields, and a ``Delivery``
of the task they carry (or of why it does not decode)."""

from __future__ import annotations

from typing import Any

from ferry import keys
from ferry.codec import EnvelopeError, decode_task
from ferry.queue.base import Delivery
from ferry.redis_conn import text


def delivery(partition: int, stream: str, entry_id: Any, raw: bytes,
              deliveries: int = 1) -> Delivery:
    try:
        return Delivery(partition, stream, text(entry_id), raw, decode_task(raw),
                        deliveries=deliveries)
    except EnvelopeError as exc:
        return Delivery(partition, stream, text(entry_id), raw, None, str(exc), deliveries)


def field(fields: Any, wanted: str) -> bytes | None:
    """A field of an entry (its flat list of names and values), or None."""
    key = wanted.encode()
    values = iter(fields or ())
    for name, value in zip(values, values, strict=False):
        if name == key:
            return bytes(value)
    return None


def task_field(fields: Any) -> bytes:
    """The envelope from an entry's fields (empty if it has none)."""
    return field(fields, keys.TASK_FIELD) or b""
