"""Logging set-up for Ferry's processes.

``FERRY_LOG_LEVEL`` is a level for everything, optionally followed by levels for single loggers:
``INFO,ferry.batches=DEBUG`` logs one line per batch (``ferry.batches``) and INFO elsewhere.
"""

import logging
from typing import NamedTuple

from ferry.errors import ConfigError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class LogLevels(NamedTuple):
    """A ``FERRY_LOG_LEVEL`` value, parsed: the level for everything, and those of single
    loggers."""

    root: str
    named: dict[str, str]


def parse(spec: str) -> LogLevels:
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


def root_level(spec: str) -> str:
    """The level for everything (what uvicorn is given)."""
    return parse(spec).root


def configure(spec: str) -> None:
    """Set up logging as a ``FERRY_LOG_LEVEL`` value says."""
    apply(parse(spec))


def apply(levels: LogLevels) -> None:
    """Set up logging at these levels (the settings' ``log_levels``, parsed at load)."""
    logging.basicConfig(
        level=levels.root,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for name, level in levels.named.items():
        logging.getLogger(name).setLevel(level)
