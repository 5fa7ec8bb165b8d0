"""How a setting is declared: a field with its documentation, or a value parsed from one; and
the rules every list setting's text obeys (its entries, their separator, no entry twice)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from dataclasses import field
from typing import Any, TypeVar

from ferry.errors import ConfigError

ENV_PREFIX = "FERRY_"
FILE_SUFFIX = "_FILE"  # FERRY_<NAME>_FILE: the setting's value is that file's content
# Settings Ferry no longer has, and why: a variable left set says so (in the log at start, and in
# ``ferry settings``) instead of being ignored without a word.
RETIRED = {
    "FERRY_REDIS_MAX_CONNECTIONS": "retired on 2026-11-28: each process opens one multiplexed "
    "connection per Redis server (docs/performance.md, \"Which Redis client\"), no pool",
    "FERRY_REDIS_POOL_TIMEOUT_S": "retired on 2026-11-28: there is no connection pool to wait "
    "for (one multiplexed connection per Redis server)",
}
T = TypeVar("T")


def setting(default: Any, help: str, *, secret: bool = False) -> Any:  # noqa: A002 - argparse
    """A settings field with its documentation: a flag, a ``FERRY_*`` variable, a table row.
    A ``secret`` one is never shown (``ferry settings --effective`` masks it)."""
    return field(default=default, metadata={"help": help, "secret": secret})


def settable(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls`` that are settings (a flag and a variable each), in order."""
    return [f for f in dataclasses.fields(cls) if f.init and "help" in f.metadata]


def parse_now(settings: object, *names: str) -> None:
    """Read the parsed values ``names`` of ``settings`` (each a ``functools.cached_property``,
    which keeps what it computed in the instance's ``__dict__``) from its ``__post_init__``: a
    bad value is refused when the settings are built, not when it is first read."""
    for name in names:
        getattr(settings, name)


def naming(setting: str, parse: Callable[[str], T], text: str) -> T:
    """``parse(text)``; its ``ConfigError`` names ``setting`` (if it did not already)."""
    try:
        return parse(text)
    except ConfigError as exc:
        if setting in str(exc):
            raise
        raise ConfigError(f"{setting}: {exc}") from None


def entries(setting: str, text: str, *, lines: bool = False) -> list[str]:
    """The comma-separated entries of a list setting, stripped (none for a blank text; with
    ``lines``, a new line separates entries too and a blank line is none). A ';' (another
    list's separator) or an empty entry (',,', a trailing ',') is a ``ConfigError`` naming
    ``setting``: either would otherwise drop or merge entries without a word."""
    if ";" in text:
        raise ConfigError(f"{setting}: entries are separated by ',', not ';'")
    rows = [row for row in text.splitlines() if row.strip()] if lines else [text]
    if not "".join(rows).strip():
        return []
    found = [part.strip() for row in rows for part in row.split(",")]
    if "" in found:
        raise ConfigError(f"{setting}: an entry is empty (',,', or a ',' first or last)")
    return found


def refuse_duplicates(setting: str, keys: Iterable[Hashable], shown: str = "{!r}") -> None:
    """A ``ConfigError`` naming ``setting`` if a key comes twice (the later one would win, or
    count twice, without a word); ``shown`` formats the key in the message ('a key hash', for
    a key that is not to be shown)."""
    seen: set[Hashable] = set()
    for key in keys:
        if key in seen:
            raise ConfigError(f"{setting}: {shown.format(key)} is given twice")
        seen.add(key)
