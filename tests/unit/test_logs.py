"""FERRY_LOG_LEVEL: a level for everything, then optional name=LEVEL per logger."""

from __future__ import annotations

import logging

import pytest

from ferry.errors import ConfigError
from ferry.settings import BatcherSettings
from ferry.telemetry.logs import configure, parse, root_level


def test_a_plain_level_is_the_root_level() -> None:
    assert parse("info") == ("INFO", {})
    assert parse("") == ("INFO", {})


def test_loggers_get_levels_of_their_own() -> None:
    assert parse("WARNING, ferry.batches=debug") == ("WARNING", {"ferry.batches": "DEBUG"})
    assert root_level("ERROR,ferry.batches=DEBUG") == "ERROR"


@pytest.mark.parametrize("spec", ["LOUD", "INFO,ferry.batches=LOUD", "INFO,=DEBUG"])
def test_a_bad_level_is_a_config_error_naming_it(spec: str) -> None:
    with pytest.raises(ConfigError, match="log level"):
        parse(spec)
    with pytest.raises(ConfigError):
        BatcherSettings(log_level=spec)


def test_configure_sets_each_named_logger() -> None:
    logger = logging.getLogger("ferry.test_logs")
    configure("INFO,ferry.test_logs=DEBUG")
    assert logger.isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("ferry.other").isEnabledFor(logging.DEBUG)
