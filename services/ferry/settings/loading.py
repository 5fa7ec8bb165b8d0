"""Settings from flags, ``FERRY_*`` variables and secret files, once, at the entry point; the
variables that rebuild them in a child process; and the reference table of every setting."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ferry.errors import ConfigError
from ferry.settings.fields import ENV_PREFIX, FILE_SUFFIX, RETIRED, settable
from ferry.settings.rollouts import fallback_env, read_fallback_variables
from ferry.settings.services import (
    BatcherSettings,
    CommonSettings,
    GatewaySettings,
    LoggerSettings,
    UpSettings,
)

S = TypeVar("S", bound=CommonSettings)
log = logging.getLogger(__name__)


def _base_type(annotation: Any) -> type:
    hint = typing.get_origin(annotation)
    if hint in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))  # type: ignore[no-any-return]
    return annotation  # type: ignore[no-any-return]


TRUE, FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _convert(kind: type, raw: str, name: str) -> Any:
    if kind is bool:
        return _boolean(raw, name)
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}: {raw!r} is not a valid {kind.__name__}") from None


def _boolean(raw: str, name: str) -> bool:
    word = raw.strip().lower()
    if word not in TRUE + FALSE:  # 'ture' is no more false than true: it is a typo
        raise ConfigError(f"{name}: {raw!r} is not true or false ({', '.join(TRUE)}; "
                          f"{', '.join(FALSE[1:])})")
    return word in TRUE


def add_arguments(parser: argparse.ArgumentParser, cls: type[CommonSettings]) -> None:
    """One flag per setting, each help line naming its variable and default."""
    hints = typing.get_type_hints(cls)
    for f in settable(cls):
        env = ENV_PREFIX + f.name.upper()
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            metavar=_base_type(hints[f.name]).__name__.upper(),
            help=f"{f.metadata.get('help', '')} [env {env}, default {f.default!r}]",
        )


@dataclass(frozen=True)
class Given:
    """A setting's text as given, and where: its flag, its variable, or its variable's file."""

    text: str
    source: str  # '--max-batch', 'FERRY_MAX_BATCH' or 'FERRY_JWT_SECRET_FILE'


def load(cls: type[S], args: argparse.Namespace | None = None,
         environ: Mapping[str, str] | None = None) -> S:
    """Build ``cls`` from flags, then ``FERRY_*`` variables, then defaults; with a batcher's
    settings, the ``FERRY_FALLBACK_<MODEL>`` variables too. The environment is read here, and
    only here (``os.environ`` unless ``environ`` is given)."""
    # Read at start-up, by the entry point: the settings are built from the environment once.
    environ = os.environ if environ is None else environ
    for variable in sorted(RETIRED.keys() & environ.keys()):
        log.warning("%s is set, and not read: %s", variable, RETIRED[variable])
    return build(cls, given(cls, args, environ), environ)


def given(cls: type[CommonSettings], args: argparse.Namespace | None,
          environ: Mapping[str, str]) -> dict[str, Given]:
    """The settings of ``cls`` that a flag, a variable or a variable's file gives, by name
    (the flag wins, then the variable, then its file); the others keep their defaults."""
    found: dict[str, Given] = {}
    for f in settable(cls):
        env = ENV_PREFIX + f.name.upper()
        flag = getattr(args, f.name, None) if args is not None else None
        if flag is not None:
            found[f.name] = Given(str(flag), "--" + f.name.replace("_", "-"))
        elif env in environ:
            found[f.name] = Given(environ[env], env)
        elif environ.get(env + FILE_SUFFIX):
            found[f.name] = Given(_read_secret(environ[env + FILE_SUFFIX], f.name),
                                  env + FILE_SUFFIX)
    return found


def build(cls: type[S], found: Mapping[str, Given], environ: Mapping[str, str]) -> S:
    """``cls`` from the settings ``found`` gives (and a batcher's ``FERRY_FALLBACK_<MODEL>``
    variables in ``environ``); a ``ConfigError`` names the flag, variable or file of what it
    refuses."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {name: _convert(_base_type(hints[name]), value.text, value.source)
                              for name, value in found.items()}
    if issubclass(cls, BatcherSettings):
        values["fallback_variables"] = read_fallback_variables(environ)
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(_by_source(str(exc), found)) from None


def _by_source(message: str, found: Mapping[str, Given]) -> str:
    """A settings error as the operator wrote the settings: 'client_weights: ...' given by
    ``FERRY_CLIENT_WEIGHTS`` reads 'FERRY_CLIENT_WEIGHTS: ...'; a message about several
    settings gets where those given came from."""
    name, colon, rest = message.partition(": ")
    if colon and name in found:
        return f"{found[name].source}: {rest}"
    named = [value.source for name, value in found.items()
             if re.search(rf"\b{name}\b", message)]
    return f"{message} ({', '.join(named)})" if named else message


def _read_secret(path: str, name: str) -> str:
    """A setting's value from a file (a mounted Kubernetes Secret): its content, without the
    final line break."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().removesuffix("\n").removesuffix("\r")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {ENV_PREFIX}{name.upper()}{FILE_SUFFIX} "
                          f"({path}): {exc.strerror}") from None


def to_env(settings: CommonSettings, cls: type[CommonSettings]) -> dict[str, str]:
    """The ``FERRY_*`` variables that rebuild the ``cls`` part of ``settings`` in a child (a
    batcher's ``FERRY_FALLBACK_<MODEL>`` variables included)."""
    env = {ENV_PREFIX + f.name.upper(): str(getattr(settings, f.name)) for f in settable(cls)}
    if issubclass(cls, BatcherSettings) and isinstance(settings, BatcherSettings):
        env.update(fallback_env(settings.fallback_variables))
    return env


def reference_table() -> str:
    """Markdown table of every setting, for docs/configuration.md."""
    rows = ["| variable | flag | default | meaning | used by |", "|---|---|---|---|---|"]
    seen: dict[str, list[str]] = {}
    docs: dict[str, dataclasses.Field[Any]] = {}
    for cls in (GatewaySettings, BatcherSettings, UpSettings, LoggerSettings):
        for f in settable(cls):
            seen.setdefault(f.name, []).append(cls.__name__.removesuffix("Settings").lower())
    for cls in (GatewaySettings, BatcherSettings, LoggerSettings, UpSettings):
        for f in settable(cls):  # a service's meaning first; ferry up's default beside it
            docs.setdefault(f.name, f)
    up_defaults = {f.name: f.default for f in settable(UpSettings)}
    for name, f in docs.items():
        default = f"`{f.default!r}`"
        if name in up_defaults and up_defaults[name] != f.default:
            default += f" (`ferry up`: `{up_defaults[name]!r}`)"
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `--{name.replace('_', '-')}` | "
                    f"{default} | {f.metadata['help']} | {', '.join(seen[name])} |")
    return "\n".join(rows)
