"""Typed settings, one object per service, read once at the entry point.

Every setting is a command-line flag (``--max-batch``) and an environment variable with the one
prefix ``FERRY_`` (``FERRY_MAX_BATCH``); the flag wins, then the variable, then a file named by
``FERRY_<NAME>_FILE`` (secrets mounted from Kubernetes Secrets), then the default written here.
``ferry <command> --help`` prints them all with their defaults.

A structured setting (the declared rollouts and cascades, the owned partitions, the fallback
models, the API keys, the JWT algorithms, the per-client rates, the sentinels, the webhooks'
hosts, the jobs' completion windows, the log levels) is parsed once, when the settings are built,
into a typed field beside its text (``declared_rollouts`` beside ``rollouts``), and a bad value
is a ``ConfigError`` naming the setting (``load`` names its flag, variable or file instead). A
list's entries are separated by commas (``fields.entries``): a ';', an empty entry or an entry
given twice is refused, never dropped or merged. The environment is read by ``load`` (and by
``effective_table``, at the same entry point) and nowhere after.

The package, by concern: ``fields`` (how a setting is declared, a list's rules), ``redis``,
``triton``, ``webhooks``, ``auth``, ``jobs``, ``rollouts`` (rollouts, cascades, fallbacks),
``declarations`` (what a rollout and a cascade declare), ``partitions``, ``fairness``, ``logs``;
``services`` composes them into the services' settings, ``loading`` builds those, and
``effective`` shows what they are (``ferry settings --effective``).

The settings sit below what they configure: they import no feature, only ``ferry.errors`` and
``ferry.durations`` (test_architecture checks it). The values a setting is parsed into (an API
key's entry, a rate, a rollout's record, a cascade, a Redis address, a Triton target, the log
levels) live here, and ``auth``, ``rollouts``, ``resp``, ``triton`` and ``telemetry`` import
them from here (and name them too, for their callers).
"""

from ferry.settings.auth import AUTH_MODES, MIN_ADMIN_TOKEN
from ferry.settings.effective import effective_table
from ferry.settings.fields import ENV_PREFIX, FILE_SUFFIX, setting
from ferry.settings.loading import add_arguments, load, reference_table, to_env
from ferry.settings.partitions import parse_partitions
from ferry.settings.rollouts import (
    FALLBACK_ENV_PREFIX,
    NO_FALLBACKS,
    Fallbacks,
    env_model_name,
)
from ferry.settings.services import BatcherSettings, CommonSettings, GatewaySettings, UpSettings

__all__ = [
    "AUTH_MODES",
    "ENV_PREFIX",
    "FALLBACK_ENV_PREFIX",
    "FILE_SUFFIX",
    "MIN_ADMIN_TOKEN",
    "NO_FALLBACKS",
    "BatcherSettings",
    "CommonSettings",
    "Fallbacks",
    "GatewaySettings",
    "UpSettings",
    "add_arguments",
    "effective_table",
    "env_model_name",
    "load",
    "parse_partitions",
    "reference_table",
    "setting",
    "to_env",
]
