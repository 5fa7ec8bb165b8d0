"""``log_level``: the root level, then a level per logger, parsed once (``ferry.telemetry.logs``
sets logging up at these levels)."""

from __future__ import annotations

from typing import NamedTuple

from ferry.errors import ConfigError
from ferry.settings.fields import entries, naming, refuse_duplicates

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class LogLevels(NamedTuple):
    """A ``FERRY_LOG_LEVEL`` value, parsed: the level for everything, and those of single
    loggers."""

    root: str
    named: dict[str, str]


def log_levels(spec: str) -> LogLevels:
    """A level, then ``name=LEVEL`` entries, comma-separated, each logger once."""
    parts = entries("log_level", spec)
    levels = naming("log_level", parse_log_levels, spec)
    refuse_duplicates("log_level", (part.partition("=")[0].strip() for part in parts[1:]))
    return levels


def parse_log_levels(spec: str) -> LogLevels:
    """The root level and the per-logger levels of a ``FERRY_LOG_LEVEL`` value."""
    root, *named = [part.strip() for part in spec.split(",") if part.strip()] or ["INFO"]
    levels: dict[str, str] = {}
    for part in named:
        name, _, level = part.partition("=")
        levels[name.strip()] = level.strip().upper()
    for level in (root.upper(), *levels.values()):
        if level not in LEVELS:
            raise ConfigError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if any(not name for name in levels):
        raise ConfigError(f"log level {spec!r}: a logger's level is written name=LEVEL")
    return LogLevels(root.upper(), levels)
