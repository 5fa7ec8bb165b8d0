"""Logging set-up for Ferry's processes.

``FERRY_LOG_LEVEL`` is a level for everything, optionally followed by levels for single loggers:
``INFO,ferry.batches=DEBUG`` logs one line per batch (``ferry.batches``) and INFO elsewhere.
"""

import logging

from ferry.settings.logs import LEVELS, LogLevels
from ferry.settings.logs import parse_log_levels as parse

# What a level may be, and how a value is parsed, are the settings' (they parse it when they
# are built, and import no feature): named here too.
__all__ = ["LEVELS", "LogLevels", "apply", "configure", "parse", "root_level"]


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
