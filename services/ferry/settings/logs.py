"""``log_level``: the root level, then a level per logger, parsed once."""

from __future__ import annotations

from ferry.settings.fields import entries, naming, refuse_duplicates
from ferry.telemetry.logs import LogLevels
from ferry.telemetry.logs import parse as parse_log_levels


def log_levels(spec: str) -> LogLevels:
    """A level, then ``name=LEVEL`` entries, comma-separated, each logger once."""
    parts = entries("log_level", spec)
    levels = naming("log_level", parse_log_levels, spec)
    refuse_duplicates("log_level", (part.partition("=")[0].strip() for part in parts[1:]))
    return levels
