"""Settings from flags, ``FERRY_*`` variables and secret files, once, at the entry point; the
variables that rebuild them in a child process; and the reference table of every setting."""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from ferry.errors import ConfigError
from ferry.settings.fields import ENV_PREFIX, FILE_SUFFIX, settable
from ferry.settings.rollouts import fallback_env, read_fallback_variables
from ferry.settings.services import BatcherSettings, CommonSettings, GatewaySettings, UpSettings

S = TypeVar("S", bound=CommonSettings)


def _base_type(annotation: Any) -> type:
    hint = typing.get_origin(annotation)
    if hint in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))  # type: ignore[no-any-return]
    return annotation  # type: ignore[no-any-return]


def _convert(kind: type, raw: str, name: str) -> Any:
    try:
        if kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}: {raw!r} is not a valid {kind.__name__}") from None


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


def load(cls: type[S], args: argparse.Namespace | None = None,
         environ: Mapping[str, str] | None = None) -> S:
    """Build ``cls`` from flags, then ``FERRY_*`` variables, then defaults; with a batcher's
    settings, the ``FERRY_FALLBACK_<MODEL>`` variables too. The environment is read here, and
    only here (``os.environ`` unless ``environ`` is given)."""
    # Read at start-up, by the entry point: the settings are built from the environment once.
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in settable(cls):
        raw = getattr(args, f.name, None) if args is not None else None
        if raw is None:
            raw = environ.get(ENV_PREFIX + f.name.upper())
        if raw is None and environ.get(ENV_PREFIX + f.name.upper() + FILE_SUFFIX):
            raw = _read_secret(environ[ENV_PREFIX + f.name.upper() + FILE_SUFFIX], f.name)
        if raw is not None:
            values[f.name] = _convert(_base_type(hints[f.name]), str(raw), f.name)
    if issubclass(cls, BatcherSettings):
        values["fallback_variables"] = read_fallback_variables(environ)
    return cls(**values)


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
    for cls in (GatewaySettings, BatcherSettings, UpSettings):
        for f in settable(cls):
            seen.setdefault(f.name, []).append(cls.__name__.removesuffix("Settings").lower())
            docs.setdefault(f.name, f)
    up_defaults = {f.name: f.default for f in settable(UpSettings)}
    for name, f in docs.items():
        default = f"`{f.default!r}`"
        if name in up_defaults and up_defaults[name] != f.default:
            default += f" (`ferry up`: `{up_defaults[name]!r}`)"
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `--{name.replace('_', '-')}` | "
                    f"{default} | {f.metadata['help']} | {', '.join(seen[name])} |")
    return "\n".join(rows)
