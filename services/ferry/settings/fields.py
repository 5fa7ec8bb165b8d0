"""How a setting is declared: a field with its documentation, or a value parsed from one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import field
from typing import Any, TypeVar

from ferry.errors import ConfigError

ENV_PREFIX = "FERRY_"
FILE_SUFFIX = "_FILE"  # FERRY_<NAME>_FILE: the setting's value is that file's content
T = TypeVar("T")


def setting(default: Any, help: str) -> Any:  # noqa: A002 - mirrors argparse's name
    """A settings field with its documentation: a flag, a ``FERRY_*`` variable, a table row."""
    return field(default=default, metadata={"help": help})


def settable(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls`` that are settings (a flag and a variable each), in order."""
    return [f for f in dataclasses.fields(cls) if f.init and "help" in f.metadata]


def fill(settings: object, **values: Any) -> None:
    """Set parsed fields on frozen settings (from their ``__post_init__``)."""
    for name, value in values.items():
        object.__setattr__(settings, name, value)


def naming(setting: str, parse: Callable[[str], T], text: str) -> T:
    """``parse(text)``; its ``ConfigError`` names ``setting`` (if it did not already)."""
    try:
        return parse(text)
    except ConfigError as exc:
        if setting in str(exc):
            raise
        raise ConfigError(f"{setting}: {exc}") from None
