"""Which model or version answers: the declared rollouts and cascades (JSON objects), and the
fallback models of an open circuit breaker (``fallback_models`` and ``FERRY_FALLBACK_<MODEL>``),
each parsed once, when the settings are built."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry.errors import ConfigError
from ferry.settings.declarations import Cascade, parse_cascades, parse_declared
from ferry.settings.fields import ENV_PREFIX, FILE_SUFFIX, entries, naming, refuse_duplicates

FALLBACK_ENV_PREFIX = ENV_PREFIX + "FALLBACK_"
MODEL = re.compile(r"[^\s=,;]+")  # a model's name: no space, nor a list's separators


def declared_rollouts(spec: str) -> Mapping[str, Mapping[str, Any]]:
    """The ``rollouts`` setting: model to its declared rollout's fields."""
    declared = naming("rollouts", parse_declared, spec)
    refuse_duplicate_keys("rollouts", spec)
    return declared


def declared_cascades(spec: str) -> Mapping[str, Cascade]:
    """The ``cascades`` setting: model to the cascade that reviews its answers."""
    cascades = naming("cascades", parse_cascades, spec)
    refuse_duplicate_keys("cascades", spec)
    for cascade in cascades.values():
        kind, _, labels = cascade.when.partition(":")
        if kind == "labels":
            setting = f"cascades: the labels of {cascade.model!r}"
            refuse_duplicates(setting, entries(setting, labels))
    return cascades


def refuse_duplicate_keys(setting: str, spec: str) -> None:
    """A JSON object's key given twice, at any depth, is a ``ConfigError`` naming ``setting``
    (a JSON parser keeps the last one without a word); ``spec`` is valid JSON or blank."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        refuse_duplicates(setting, (key for key, _ in items))
        return dict(items)

    if spec.strip():
        json.loads(spec, object_pairs_hook=pairs)


def env_model_name(model: str) -> str:
    """How a ``FERRY_FALLBACK_<MODEL>`` variable names a model: upper case, '-' and '.' as '_'."""
    return model.upper().replace("-", "_").replace(".", "_")


@dataclass(frozen=True)
class Fallbacks:
    """Which model answers for a model whose circuit breaker is open."""

    named: Mapping[str, str]  # from fallback_models
    variables: Mapping[str, str]  # FERRY_FALLBACK_<MODEL> values, by <MODEL>

    def of(self, model: str) -> str | None:
        """The fallback of ``model`` (a variable wins over the list), or None."""
        fallback = self.variables.get(env_model_name(model)) or self.named.get(model)
        return fallback if fallback and fallback != model else None


NO_FALLBACKS = Fallbacks({}, {})


# FERRY_FALLBACK_MODELS (and its _FILE) is the fallback_models setting, not a model's variable
NOT_A_MODEL = frozenset({"MODELS", "MODELS" + FILE_SUFFIX})


def read_fallback_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``FERRY_FALLBACK_<MODEL>`` variables of ``environ`` that name a model, by <MODEL>
    (read by the loader, with the other variables, once)."""
    found = {name[len(FALLBACK_ENV_PREFIX):]: value.strip() for name, value in environ.items()
             if name.startswith(FALLBACK_ENV_PREFIX) and value.strip()}
    return {model: value for model, value in found.items() if model not in NOT_A_MODEL}


def fallback_env(variables: Mapping[str, str]) -> dict[str, str]:
    """The ``FERRY_FALLBACK_<MODEL>`` variables that give ``variables`` back to a child."""
    return {FALLBACK_ENV_PREFIX + model: value for model, value in variables.items()}


def fallbacks_of(spec: str, variables: Mapping[str, str]) -> Fallbacks:
    """``fallback_models`` ('a=b,c=d': each model once) and the ``FERRY_FALLBACK_<MODEL>``
    values, by <MODEL>."""
    pairs = [_fallback(part) for part in entries("fallback_models", spec)]
    refuse_duplicates("fallback_models", (model for model, _ in pairs))
    return Fallbacks(dict(pairs), {model: value.strip() for model, value in variables.items()
                                   if value.strip()})


def _fallback(part: str) -> tuple[str, str]:
    model, sep, fallback = (x.strip() for x in part.partition("="))
    if not sep or not MODEL.fullmatch(model) or not MODEL.fullmatch(fallback) \
            or model == fallback:
        raise ConfigError(f"fallback_models: {part!r} is not 'model=other_model'")
    return model, fallback
