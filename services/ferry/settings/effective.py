"""``ferry settings --effective SERVICE``: the settings a service would run with here, from the
same flags, variables and files it would read, each with where it came from and, for a
structured setting, what it was read as; secrets masked. A setting the service would refuse is
refused here too, with the same message."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ferry.settings.fields import ENV_PREFIX, FILE_SUFFIX, RETIRED, settable
from ferry.settings.loading import Given, build, given
from ferry.settings.rollouts import FALLBACK_ENV_PREFIX
from ferry.settings.services import BatcherSettings, CommonSettings, GatewaySettings

MASKED = "*masked*"
# A password in a URL: its userinfo's (redis://user:pw@host) or a query's (?password=pw)
URL_PASSWORD = re.compile(r"(?P<keep>[a-z][a-z0-9+.-]*://[^:@/\s]*:)[^@/\s]+(?=@)", re.I)
QUERY_PASSWORD = re.compile(r"(?P<keep>[?&](?:password|secret|token)=)[^&\s]*", re.I)


def effective_table(cls: type[CommonSettings], args: argparse.Namespace | None,
                    environ: Mapping[str, str]) -> str:
    """Markdown: a row per setting of ``cls`` (and per ``FERRY_FALLBACK_<MODEL>`` variable):
    its value, where it came from and what it was read as; then the ``FERRY_*`` variables
    it does not read. A ``ConfigError`` if the service would refuse them."""
    found = given(cls, args, environ)
    settings = build(cls, found, environ)
    service = cls.__name__.removesuffix("Settings").lower()
    rows = [f"Settings of `ferry {service}` in effect (secrets masked):", "",
            "| variable | value | from | read as |", "|---|---|---|---|"]
    for f in settable(cls):
        rows.append(_row(settings, f, found.get(f.name)))
    if isinstance(settings, BatcherSettings):
        rows.extend(f"| `{FALLBACK_ENV_PREFIX}{model}` | `{shown(value)}` | "
                    f"`{FALLBACK_ENV_PREFIX}{model}` | {model} (a model's name in capitals, "
                    f"'-' and '.' as '_') → {_escaped(value)} |"
                    for model, value in sorted(settings.fallback_variables.items()))
    unread = list(not_read(cls, found, environ))
    if unread:
        rows.extend(["", "Not read:", *(f"- `{name}`: {why}" for name, why in unread)])
    return "\n".join(rows)


def _row(settings: CommonSettings, f: dataclasses.Field[Any], value: Given | None) -> str:
    text = getattr(settings, f.name)
    source = value.source if value else "default"
    secret = f.metadata.get("secret") or source.endswith(FILE_SUFFIX)
    cell = MASKED if secret and text != "" else f"`{shown(text)}`"
    read_as = READ_AS.get(f.name)
    return (f"| `{ENV_PREFIX}{f.name.upper()}` | {cell} | "
            f"{'default' if value is None else f'`{source}`'} | "
            f"{_escaped(read_as(settings)) if read_as else ''} |")


def shown(value: object) -> str:
    """A setting's value as a table shows it: its repr, any password in a URL masked."""
    text = repr(value)
    text = URL_PASSWORD.sub(rf"\g<keep>{MASKED}", text)
    return _escaped(QUERY_PASSWORD.sub(rf"\g<keep>{MASKED}", text))


def _escaped(text: str) -> str:
    return text.replace("|", "\\|")


def not_read(cls: type[CommonSettings], found: Mapping[str, Given],
             environ: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    """Each ``FERRY_*`` variable of ``environ`` that ``cls`` does not read, and why: no such
    setting (a typo, or another service's), or a flag or the variable itself wins over it."""
    names = {ENV_PREFIX + f.name.upper(): f.name for f in settable(cls)}
    names.update({env + FILE_SUFFIX: name for env, name in names.items()})
    service = cls.__name__.removesuffix("Settings").lower()
    for variable in sorted(environ):
        if variable in names:
            value = found.get(names[variable])
            if value is None or value.source != variable:
                yield variable, (f"`{value.source}` wins over it" if value else "empty")
        elif variable in RETIRED:
            yield variable, RETIRED[variable]
        elif variable.startswith(ENV_PREFIX) and not (
                issubclass(cls, BatcherSettings) and variable.startswith(FALLBACK_ENV_PREFIX)):
            yield variable, f"not a setting of `ferry {service}`"


# --- what a structured setting was read as ------------------------------------------------------

def _weights(settings: GatewaySettings) -> str:
    weights = ", ".join(f"{client}: {weight:g}"
                        for client, weight in sorted(settings.client_weight_map.items()))
    return f"{weights}; any other client: 1" if weights else "every client: 1"


def _rates(settings: GatewaySettings) -> str:
    return ", ".join(f"{client}: " + (f"{rate.per_min}/min, bursts of {rate.burst}"
                                      if rate.per_min else "no limit")
                     for client, rate in sorted(settings.rate_limit_overrides.items()))


def _keys(settings: GatewaySettings) -> str:
    if settings.auth != "api_key":
        return "not read: auth is not api_key"
    return ", ".join(key.client_id + (f" (weight {key.weight:g})" if key.weight else "")
                     for key in settings.api_key_entries)


def _algorithms(settings: GatewaySettings) -> str:
    return ", ".join(settings.jwt_algorithm_names) or "not read: auth is not jwt"


def _partitions(settings: BatcherSettings) -> str:
    if settings.follows_replicas:
        return "by the replica count"
    runs: list[list[int]] = []
    for number in settings.owned:
        if runs and runs[-1][-1] == number - 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def _levels(settings: CommonSettings) -> str:
    named = "".join(f", {name}: {level}" for name, level in settings.log_levels.named.items())
    return f"{settings.log_levels.root}{named}"


def _fallbacks(settings: BatcherSettings) -> str:
    return ", ".join(f"{model} → {fallback}"
                     for model, fallback in sorted(settings.fallbacks.named.items()))


def _seconds(name: str) -> Callable[[Any], str]:
    return lambda settings: f"{getattr(settings, name):g} s"


READ_AS: dict[str, Callable[[Any], str]] = {
    "client_weights": _weights,
    "rate_limits": _rates,
    "api_keys": _keys,
    "jwt_algorithms": _algorithms,
    "owned_partitions": _partitions,
    "log_level": _levels,
    "fallback_models": _fallbacks,
    "redis_sentinels": lambda s: ", ".join(f"{h}:{p}" for h, p in s.redis_sentinel_nodes),
    "webhook_allowed_hosts": lambda s: ", ".join(sorted(s.webhook_hosts)) or "webhooks off",
    "rollouts": lambda s: ", ".join(s.declared_rollouts),
    "cascades": lambda s: ", ".join(f"{c.model} reviewed by {c.review_model} ({c.when})"
                                    for c in s.declared_cascades.values()),
    "job_completion_window": _seconds("job_completion_window_s"),
    "job_max_completion_window": _seconds("job_max_completion_window_s"),
}
