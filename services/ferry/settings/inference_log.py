"""The inference log's settings: which models are logged and at what rate (``log_models``),
the fields redacted (``log_redact``), the sink's location (``log_sink``) and the bounds, each
parsed or checked once, when the settings are built (docs/inference-log.md).

Like every settings module, this one imports no feature package: the inference log's own code
(``ferry.inference_log``) reads the values parsed here."""

from __future__ import annotations

import math
import re

from ferry.errors import ConfigError
from ferry.settings.fields import entries, naming, refuse_duplicates

# A model's name as Triton takes it (and as it goes into a key's hash tag: no braces).
MODEL = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
# A field name to redact: a JSON object's key, as written (no ',' or '=', no spaces at its ends).
FIELD = re.compile(r"[^,=\s](?:[^,=]{0,126}[^,=\s])?")
SINK_SCHEMES = ("file://", "s3://", "http://", "https://")
MIN_ROTATE_BYTES = 1024


def log_rates(spec: str) -> dict[str, float]:
    """``model=rate`` entries, comma-separated: each model once, its rate the share of its
    finished tasks logged, above 0 and at most 1 (``model`` alone: 1)."""
    pairs = [naming("log_models", _rated, part) for part in entries("log_models", spec)]
    refuse_duplicates("log_models", (model for model, _ in pairs))
    return dict(pairs)


def _rated(part: str) -> tuple[str, float]:
    model, sep, value = (text.strip() for text in part.partition("="))
    try:
        rate = float(value) if sep else 1.0
    except ValueError:
        rate = math.nan
    if not MODEL.fullmatch(model) or not 0 < rate <= 1:
        raise ConfigError(f"{part!r} is not 'model=rate' with a model name (letters, digits, "
                          "._-) and a rate above 0 and at most 1 (0.1: one task in ten)")
    return model, rate


def redacted_fields(spec: str) -> frozenset[str]:
    """``log_redact``: names of JSON fields whose values are replaced, comma-separated, each
    once."""
    names = entries("log_redact", spec)
    for name in names:
        if not FIELD.fullmatch(name):
            raise ConfigError(f"log_redact: {name!r} is not a field name (1-128 characters, "
                              "no ',' or '=')")
    refuse_duplicates("log_redact", names)
    return frozenset(names)


def check_log_bounds(max_records: int, max_payload_bytes: int) -> None:
    """The batcher's bounds: ``log_max_records``, the stream's length; and
    ``log_max_payload_bytes``, a request's or an answer's size in a record."""
    if max_records < 1:
        raise ConfigError("log_max_records must be at least 1")
    if max_payload_bytes < 64:
        raise ConfigError("log_max_payload_bytes must be at least 64")


def check_log_sink(sink: str) -> str:
    """``log_sink``: a directory, ``file://DIR``, ``s3://bucket/prefix`` or an ``http(s)://``
    CloudEvents receiver; stripped."""
    sink = sink.strip()
    if not sink:
        raise ConfigError("log_sink: empty: a directory, file://DIR, s3://bucket/prefix or an "
                          "http(s):// URL")
    if "://" in sink and not sink.startswith(SINK_SCHEMES):
        raise ConfigError(f"log_sink: {sink!r}: the scheme must be one of "
                          f"{', '.join(SINK_SCHEMES)} (or a plain directory)")
    if sink.startswith("s3://") and not sink.removeprefix("s3://").split("/")[0]:
        raise ConfigError(f"log_sink: {sink!r} names no bucket (s3://bucket/prefix)")
    if sink.startswith("file://") and not sink.removeprefix("file://"):
        raise ConfigError(f"log_sink: {sink!r} names no directory")
    return sink


def check_rotation(rotate_bytes: int, rotate_s: float, metrics_port: int) -> None:
    """The logger's files (``log_rotate_bytes``, ``log_rotate_s``) and its /metrics port."""
    if rotate_bytes < MIN_ROTATE_BYTES or not rotate_s > 0:
        raise ConfigError(f"log_rotate_bytes must be at least {MIN_ROTATE_BYTES} and "
                          "log_rotate_s above 0")
    if not 0 <= metrics_port <= 65535:
        raise ConfigError("log_metrics_port must be a port (0: off)")
