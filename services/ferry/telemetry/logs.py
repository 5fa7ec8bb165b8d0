"""Logging set-up for Ferry's processes.

``FERRY_LOG_LEVEL`` is a level for everything, optionally followed by levels for single loggers:
``INFO,ferry.batches=DEBUG`` logs one line per batch (``ferry.batches``) and INFO elsewhere.
"""

import logging

from ferry.errors import ConfigError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse(spec: str) -> tuple[str, dict[str, str]]:
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
    return root.upper(), levels


def root_level(spec: str) -> str:
    """The level for everything (what uvicorn is given)."""
    return parse(spec)[0]


def configure(spec: str) -> None:
    root, levels = parse(spec)
    logging.basicConfig(
        level=root,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
