"""Which model or version answers: the declared rollouts and cascades (JSON objects), and the
fallback models of an open circuit breaker (``fallback_models`` and ``FERRY_FALLBACK_<MODEL>``),
each parsed once, when the settings are built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry.errors import ConfigError
from ferry.rollouts.cascade import Cascade, parse_cascades
from ferry.rollouts.rollout import parse_declared
from ferry.settings.fields import ENV_PREFIX, FILE_SUFFIX, naming

FALLBACK_ENV_PREFIX = ENV_PREFIX + "FALLBACK_"


def declared_rollouts(spec: str) -> Mapping[str, Mapping[str, Any]]:
    """The ``rollouts`` setting: model to its declared rollout's fields."""
    return naming("rollouts", parse_declared, spec)


def declared_cascades(spec: str) -> Mapping[str, Cascade]:
    """The ``cascades`` setting: model to the cascade that reviews its answers."""
    return naming("cascades", parse_cascades, spec)


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
    """``fallback_models`` ('a=b,c=d') and the ``FERRY_FALLBACK_<MODEL>`` values, by <MODEL>."""
    named: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        model, sep, fallback = (x.strip() for x in part.partition("="))
        if not sep or not model or not fallback or model == fallback:
            raise ConfigError(f"fallback_models {spec!r}: {part!r} is not 'model=other_model'")
        named[model] = fallback
    return Fallbacks(named, {model: value.strip() for model, value in variables.items()
                             if value.strip()})
