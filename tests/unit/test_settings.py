"""Settings: flag > FERRY_* variable > default, with type conversion and validation."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ferry.auth.api_keys import config_line, key_hash
from ferry.auth.rate_limit import Rate
from ferry.errors import ConfigError
from ferry.rollouts.cascade import Cascade
from ferry.settings import (
    BatcherSettings,
    CommonSettings,
    GatewaySettings,
    UpSettings,
    add_arguments,
    load,
    parse_partitions,
    reference_table,
    to_env,
)
from ferry.settings.fields import settable


def parse(cls: type[CommonSettings], argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ferry-test")
    add_arguments(parser, cls)
    return parser.parse_args(argv)


# --- load: precedence -------------------------------------------------------------------------


def test_defaults_when_nothing_is_set() -> None:
    settings = load(BatcherSettings, parse(BatcherSettings, []), environ={})
    assert settings == BatcherSettings()
    assert settings.max_batch == 64
    assert settings.max_wait_ms == 50.0
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.owned_partitions == "all"


def test_load_without_args_uses_environment() -> None:
    settings = load(BatcherSettings, None, environ={"FERRY_MAX_BATCH": "12"})
    assert settings.max_batch == 12


def test_environment_overrides_default() -> None:
    env = {"FERRY_MAX_BATCH": "8", "FERRY_MAX_WAIT_MS": "12.5",
           "FERRY_REDIS_URL": "redis://cache:6380/2"}
    settings = load(BatcherSettings, parse(BatcherSettings, []), environ=env)
    assert settings.max_batch == 8
    assert settings.max_wait_ms == 12.5
    assert settings.redis_url == "redis://cache:6380/2"
    assert settings.max_inflight_batches == 0  # untouched default: the model's instance count


def test_flag_overrides_environment() -> None:
    args = parse(BatcherSettings, ["--max-batch", "32", "--max-wait-ms", "7"])
    settings = load(BatcherSettings, args,
                    environ={"FERRY_MAX_BATCH": "8", "FERRY_MAX_WAIT_MS": "12.5"})
    assert settings.max_batch == 32
    assert settings.max_wait_ms == 7.0
    assert isinstance(settings.max_wait_ms, float)


def test_flag_overrides_default_without_environment() -> None:
    args = parse(GatewaySettings, ["--port", "9001", "--default-model", "sim"])
    settings = load(GatewaySettings, args, environ={})
    assert settings.port == 9001
    assert settings.default_model == "sim"
    assert settings.host == "127.0.0.1"


def test_unprefixed_and_lowercase_variables_are_ignored() -> None:
    env = {"MAX_BATCH": "3", "ferry_max_batch": "5", "FERRY_MAXBATCH": "7"}
    assert load(BatcherSettings, None, environ=env).max_batch == 64


def test_variables_for_other_services_do_not_leak_in() -> None:
    settings = load(GatewaySettings, None, environ={"FERRY_MAX_BATCH": "not-even-an-int"})
    assert not hasattr(settings, "max_batch")


def test_load_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_PARTITIONS", "4")
    assert load(CommonSettings).partitions == 4


# --- load: conversion and validation errors ---------------------------------------------------


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"FERRY_MAX_BATCH": "lots"}, "max_batch"),
        ({"FERRY_MAX_BATCH": "1.5"}, "max_batch"),
        ({"FERRY_MAX_BATCH": ""}, "max_batch"),
        ({"FERRY_MAX_WAIT_MS": "soon"}, "max_wait_ms"),
        ({"FERRY_PARTITIONS": "16x"}, "partitions"),
    ],
)
def test_bad_type_in_environment_raises_config_error(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^FERRY_{field.upper()}: "):
        load(BatcherSettings, None, environ=env)


def test_bad_type_in_flag_raises_config_error() -> None:
    args = parse(BatcherSettings, ["--max-attempts", "three"])
    with pytest.raises(ConfigError, match=r"^--max-attempts: 'three' is not a valid int"):
        load(BatcherSettings, args, environ={})


@pytest.mark.parametrize(
    "env",
    [
        {"FERRY_MAX_BATCH": "0"},
        {"FERRY_MAX_WAIT_MS": "-1"},
        {"FERRY_MAX_ATTEMPTS": "0"},
        {"FERRY_MAX_INFLIGHT_BATCHES": "-1"},
        {"FERRY_PARTITIONS": "0"},
        {"FERRY_RESULT_TTL_S": "0"},
        {"FERRY_OWNED_PARTITIONS": "16"},  # default 16 partitions: 0..15
        {"FERRY_PARTITIONS": "4", "FERRY_OWNED_PARTITIONS": "0-4"},
        {"FERRY_OWNED_PARTITIONS": "one"},
    ],
)
def test_invalid_values_raise_config_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load(BatcherSettings, None, environ=env)


def test_gateway_rejects_non_positive_body_limit() -> None:
    with pytest.raises(ConfigError, match="max_body_bytes must be positive"):
        GatewaySettings(max_body_bytes=0)


@pytest.mark.parametrize("field", ["header_timeout_s", "body_timeout_s"])
def test_gateway_rejects_read_timeouts_that_are_not_positive(field: str) -> None:
    with pytest.raises(ConfigError, match="header_timeout_s and body_timeout_s must be positive"):
        settings: dict[str, Any] = {field: 0.0}
        GatewaySettings(**settings)


def test_zero_max_wait_is_allowed() -> None:
    assert BatcherSettings(max_wait_ms=0.0).max_wait_ms == 0.0


def test_owned_partitions_within_partitions_is_accepted() -> None:
    settings = BatcherSettings(partitions=4, owned_partitions="0-1,3")
    assert settings.owned == (0, 1, 3)
    assert not settings.follows_replicas


# --- parse_partitions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "total", "expected"),
    [
        ("all", 4, (0, 1, 2, 3)),
        (" ALL ", 2, (0, 1)),
        ("0-3,7", 8, (0, 1, 2, 3, 7)),
        ("7,0-3", 8, (0, 1, 2, 3, 7)),
        ("5", 8, (5,)),
        ("2-2", 8, (2,)),
        (" 1 , 3 ", 8, (1, 3)),
        ("0-15", 16, tuple(range(16))),
    ],
)
def test_parse_partitions(spec: str, total: int, expected: tuple[int, ...]) -> None:
    assert parse_partitions(spec, total) == expected


@pytest.mark.parametrize("spec", ["x", "1-b", "0-3-5", "1.5", "-1", "a-3"])
def test_parse_partitions_syntax_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="is not N or N-M"):
        parse_partitions(spec, 8)


@pytest.mark.parametrize("spec", ["8", "0-8", "3-1", "", " "])
def test_parse_partitions_out_of_range_or_empty(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"must name partitions in 0\.\.7"):
        parse_partitions(spec, 8)


# --- to_env / UpSettings ------------------------------------------------------------------------


def test_to_env_round_trips_through_load() -> None:
    original = BatcherSettings(
        redis_url="redis://r:1/3", partitions=8, max_batch=17, max_wait_ms=12.5,
        owned_partitions="0-3,7", backoff_max_ms=750.0, metrics_port=0)
    env = to_env(original, BatcherSettings)
    assert env["FERRY_MAX_BATCH"] == "17"
    assert env["FERRY_MAX_WAIT_MS"] == "12.5"
    assert env["FERRY_OWNED_PARTITIONS"] == "0-3,7"
    assert set(env) == {"FERRY_" + f.name.upper() for f in settable(BatcherSettings)}
    assert load(BatcherSettings, None, environ=env) == original


def test_to_env_of_up_settings_rebuilds_the_batcher_part() -> None:
    up = UpSettings(redis_url="redis://127.0.0.1:7000/0", triton_url="127.0.0.1:9001",
                    max_batch=5, port=8123)
    env = to_env(up, BatcherSettings)
    assert "FERRY_PORT" not in env
    assert "FERRY_STATE_DIR" not in env
    batcher = load(BatcherSettings, None, environ=env)
    assert batcher.max_batch == 5
    assert batcher.redis_url == "redis://127.0.0.1:7000/0"
    assert batcher.triton_url == "127.0.0.1:9001"


def test_up_settings_defaults() -> None:
    up = UpSettings()
    assert up.redis_url == ""
    assert up.triton_url == ""
    assert up.model_repository == ""
    assert up.state_dir == ".ferry"
    assert up.metrics_port == 0
    # inherited from both parents
    assert up.port == 8000
    assert up.max_batch == 64


def test_up_settings_validate_both_parents() -> None:
    with pytest.raises(ConfigError):
        UpSettings(max_body_bytes=0)
    with pytest.raises(ConfigError):
        UpSettings(max_batch=0)


def test_up_settings_empty_redis_url_from_environment() -> None:
    up = load(UpSettings, None, environ={"FERRY_REDIS_URL": ""})
    assert up.redis_url == ""


def test_triton_grpc_target_strips_scheme() -> None:
    assert CommonSettings(triton_url="grpc://h:8001").triton_grpc_target == "h:8001"
    assert CommonSettings(triton_url="h:8001").triton_grpc_target == "h:8001"


# --- help and reference -----------------------------------------------------------------------


def test_help_names_variable_and_default() -> None:
    parser = argparse.ArgumentParser(prog="ferry-test")
    add_arguments(parser, BatcherSettings)
    text = " ".join(parser.format_help().split())  # undo argparse's line wrapping
    assert "--max-batch INT" in text
    assert "--max-wait-ms FLOAT" in text
    assert ("a batch leaves when it holds this many requests "
            "[env FERRY_MAX_BATCH, default 64]") in text
    assert "[env FERRY_OWNED_PARTITIONS, default 'all']" in text


def test_unset_flags_default_to_none() -> None:
    args = parse(BatcherSettings, [])
    assert args.max_batch is None
    assert args.redis_url is None


def test_reference_table_lists_every_setting() -> None:
    table = reference_table()
    lines = table.splitlines()
    assert lines[0] == "| variable | flag | default | meaning | used by |"
    assert lines[1] == "|---|---|---|---|---|"
    assert ("| `FERRY_MAX_BATCH` | `--max-batch` | `64` | "
            "a batch leaves when it holds this many requests | batcher, up |") in lines
    assert any(line.startswith("| `FERRY_REDIS_URL` | `--redis-url` |") and
               line.endswith("| gateway, batcher, up, logger |") for line in lines)
    assert any(line.startswith("| `FERRY_STATE_DIR` |") and line.endswith("| up |")
               for line in lines)
    assert any(line.startswith("| `FERRY_PORT` |") and line.endswith("| gateway, up |")
               for line in lines)
    names = {f.name for cls in (GatewaySettings, BatcherSettings, UpSettings)
             for f in settable(cls)}
    assert len(lines) == 2 + len(names)




def test_gateway_workers_default_to_one_per_core_and_cannot_be_negative() -> None:
    assert load(GatewaySettings, None, environ={}).workers == 0
    assert load(GatewaySettings, None, environ={"FERRY_WORKERS": "3"}).workers == 3
    with pytest.raises(ConfigError):
        load(GatewaySettings, None, environ={"FERRY_WORKERS": "-1"})


# --- fallback models ------------------------------------------------------------------------------


def test_fallbacks_from_the_list_and_variables() -> None:
    settings = load(BatcherSettings, None, environ={
        "FERRY_FALLBACK_MODELS": "moderation=moderation_small, sim-v2 = sim",
        "FERRY_FALLBACK_SIM_V2": "sim_backup", "FERRY_FALLBACK_OTHER": "other_small",
        "FERRY_FALLBACK_EMPTY": " "})
    assert settings.fallback_variables == {"SIM_V2": "sim_backup", "OTHER": "other_small"}
    fallbacks = settings.fallbacks
    assert fallbacks.of("moderation") == "moderation_small"
    assert fallbacks.of("sim-v2") == "sim_backup"  # the variable wins
    assert fallbacks.of("other") == "other_small"
    assert fallbacks.of("empty") is None
    assert fallbacks.of("unknown") is None


@pytest.mark.parametrize("spec", ["moderation", "=x", "a=", "a=a", "a=b,c"])
def test_bad_fallback_lists_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="fallback_models"):
        BatcherSettings(fallback_models=spec)


@pytest.mark.parametrize(
    "overrides",
    [{"max_backlog": -1}, {"max_queue_wait_s": 0}, {"default_timeout_s": -1}],
)
def test_bad_traffic_limits_are_refused(overrides: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        GatewaySettings(**overrides)  # type: ignore[arg-type]


# --- secrets from files, and the security settings ----------------------------------------------


def test_a_setting_can_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef-hs256\n")
    keys = tmp_path / "keys"
    keys.write_text(f"alice:{'a' * 64}\nbob:{'b' * 64}\n")
    settings = load(GatewaySettings, None, environ={
        "FERRY_AUTH": "jwt", "FERRY_JWT_ALGORITHMS": "HS256",
        "FERRY_JWT_SECRET_FILE": str(secret), "FERRY_API_KEYS_FILE": str(keys)})
    assert settings.jwt_secret == "0123456789abcdef0123456789abcdef-hs256"  # no line break
    assert settings.api_keys.splitlines() == [f"alice:{'a' * 64}", f"bob:{'b' * 64}"]
    direct = load(GatewaySettings, None, environ={"FERRY_JWT_SECRET": "given",
                                                  "FERRY_JWT_SECRET_FILE": str(secret)})
    assert direct.jwt_secret == "given"  # the variable itself wins over its file


def test_an_unreadable_secret_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="FERRY_REDIS_PASSWORD_FILE"):
        load(GatewaySettings, None, environ={"FERRY_REDIS_PASSWORD_FILE": "/nonexistent/pw"})


@pytest.mark.parametrize("env", [
    {"FERRY_AUTH": "basic"},
    {"FERRY_AUTH": "api_key"},  # and no keys
    {"FERRY_AUTH": "jwt"},  # RS256 and no public key or JWKS URL
    {"FERRY_AUTH": "jwt", "FERRY_JWT_ALGORITHMS": "HS256", "FERRY_JWT_SECRET": "short"},
    {"FERRY_AUTH": "jwt", "FERRY_JWT_ALGORITHMS": "none", "FERRY_JWT_SECRET": "x" * 40},
    {"FERRY_RATE_LIMIT_BURST": "-1"},
    {"FERRY_MAX_PENDING_PER_CLIENT": "-1"},
    {"FERRY_REDIS_CERT_FILE": "/c.pem"},  # and no key
    {"FERRY_TRITON_CA_FILE": "/ca.pem"},  # without triton_ssl
])
def test_unusable_security_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load(GatewaySettings, None, environ=env)


def test_fallback_variables_are_read_by_the_loader_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``FERRY_FALLBACK_<MODEL>`` is read with the other variables, at load: settings built
    directly see none of it, and a child rebuilds the same fallbacks from ``to_env``."""
    monkeypatch.setenv("FERRY_FALLBACK_SIM", "sim_slow")
    assert BatcherSettings().fallbacks.of("sim") is None
    loaded = load(BatcherSettings)
    assert loaded.fallbacks.of("sim") == "sim_slow"
    env = to_env(loaded, BatcherSettings)
    assert env["FERRY_FALLBACK_SIM"] == "sim_slow"
    assert load(BatcherSettings, None, environ=env) == loaded
    assert not hasattr(load(GatewaySettings), "fallback_variables")


def test_up_settings_hand_fallback_variables_to_the_batcher() -> None:
    up = load(UpSettings, None, environ={"FERRY_FALLBACK_SIM": "sim_slow"})
    batcher = load(BatcherSettings, None, environ=to_env(up, BatcherSettings))
    assert batcher.fallbacks.of("sim") == "sim_slow"
    assert "FERRY_FALLBACK_SIM" not in to_env(up, GatewaySettings)


# --- structured settings: parsed once, when built, into typed fields ---------------------------

KEY_LINE = config_line("alice", "fk_alice")
HS_SECRET = "s" * 32


@pytest.mark.parametrize(
    ("cls", "given", "parsed", "expected"),
    [
        (CommonSettings, {}, "declared_rollouts", {}),
        (CommonSettings, {"rollouts": '{"m": {"stable": "1", "candidate": "2", "share": 10}}'},
         "declared_rollouts", {"m": {"stable": "1", "candidate": "2", "share": 10}}),
        (CommonSettings, {}, "webhook_hosts", frozenset()),
        (CommonSettings, {"webhook_allowed_hosts": " Hooks.example:8443, b ",
                          "webhook_secret": "k"},
         "webhook_hosts", frozenset({"hooks.example:8443", "b"})),
        (CommonSettings, {}, "redis_sentinel_nodes", ()),
        (CommonSettings, {"redis_sentinels": "s1:26379, [::1]:26380"},
         "redis_sentinel_nodes", (("s1", 26379), ("::1", 26380))),
        (CommonSettings, {"log_level": "warning,ferry.batches=debug"}, "log_levels",
         ("WARNING", {"ferry.batches": "DEBUG"})),
        (BatcherSettings, {}, "owned", tuple(range(16))),
        (BatcherSettings, {"partitions": 8, "owned_partitions": "6-7,0"}, "owned", (0, 6, 7)),
        (BatcherSettings, {"owned_partitions": "auto", "replicas": 2}, "owned", ()),
        (BatcherSettings, {"owned_partitions": " Auto ", "statefulset": "ferry-batcher"},
         "follows_replicas", True),
        (BatcherSettings, {}, "follows_replicas", False),
        (BatcherSettings, {}, "declared_cascades", {}),
        (BatcherSettings, {"cascades": '{"m": {"review_model": "big", "when": "unsafe"}}'},
         "declared_cascades", {"m": Cascade("m", "big", "", "unsafe")}),
        (GatewaySettings, {}, "api_key_entries", ()),
        (GatewaySettings, {"api_keys": "not even a key"}, "api_key_entries", ()),  # auth=none
        (GatewaySettings, {}, "jwt_algorithm_names", ()),
        (GatewaySettings, {"auth": "jwt", "jwt_algorithms": "HS256, HS384",
                           "jwt_secret": HS_SECRET}, "jwt_algorithm_names", ("HS256", "HS384")),
        (GatewaySettings, {}, "rate_limit_overrides", {}),
        (GatewaySettings, {"rate_limits": "bob=60/5, carol=0", "rate_limit_burst": 7},
         "rate_limit_overrides", {"bob": Rate(60, 5), "carol": Rate(0, 7)}),
        (GatewaySettings, {}, "job_completion_window_s", 86400.0),
        (GatewaySettings, {}, "job_max_completion_window_s", 7 * 86400.0),
        (GatewaySettings, {"job_completion_window": "30m", "job_max_completion_window": "2h"},
         "job_completion_window_s", 1800.0),
    ],
)
def test_a_structured_setting_is_parsed_when_built(
        cls: type[CommonSettings], given: dict[str, Any], parsed: str, expected: object) -> None:
    assert getattr(cls(**given), parsed) == expected


def test_api_keys_are_parsed_with_auth_api_key() -> None:
    settings = GatewaySettings(auth="api_key", api_keys=f"{KEY_LINE}\nbob:{'b' * 64}")
    entries = settings.api_key_entries
    assert [e.client_id for e in entries] == ["alice", "bob"]
    assert entries[0].digest.hex() == key_hash("fk_alice")


@pytest.mark.parametrize(
    ("cls", "given", "setting"),
    [
        (CommonSettings, {"rollouts": "{not json"}, "rollouts"),
        (CommonSettings, {"rollouts": '["m"]'}, "rollouts"),
        (CommonSettings, {"rollouts": '{"m": {"stable": "1", "share": 150}}'}, "rollouts"),
        (CommonSettings, {"webhook_allowed_hosts": "hooks.example"}, "webhook_allowed_hosts"),
        (CommonSettings, {"redis_sentinels": "s1"}, "redis_sentinels"),
        (CommonSettings, {"redis_sentinels": "s1:0"}, "redis_sentinels"),
        (CommonSettings, {"log_level": "LOUD"}, "log_level"),
        (CommonSettings, {"log_level": "INFO,=DEBUG"}, "log_level"),
        (BatcherSettings, {"owned_partitions": "x"}, "owned_partitions"),
        (BatcherSettings, {"partitions": 4, "owned_partitions": "2-5"}, "owned_partitions"),
        (BatcherSettings, {"owned_partitions": ","}, "owned_partitions"),
        (BatcherSettings, {"owned_partitions": "auto"}, "owned_partitions"),
        (BatcherSettings, {"cascades": "[]"}, "cascades"),
        (BatcherSettings, {"cascades": '{"m": {"when": "unsafe"}}'}, "cascades"),
        (BatcherSettings, {"cascades": '{"m": {"review_model": "b", "when": "often"}}'},
         "cascades"),
        (BatcherSettings, {"fallback_models": "m=m"}, "fallback_models"),
        (GatewaySettings, {"auth": "api_key"}, "api_keys"),
        (GatewaySettings, {"auth": "api_key", "api_keys": "alice:abc"}, "api_keys"),
        (GatewaySettings, {"auth": "api_key", "api_keys": f"alice:{'x' * 64}"}, "api_keys"),
        (GatewaySettings, {"auth": "jwt", "jwt_algorithms": "none"}, "jwt_algorithms"),
        (GatewaySettings, {"auth": "jwt", "jwt_algorithms": "HS256,RS256",
                           "jwt_secret": HS_SECRET}, "jwt_algorithms"),
        (GatewaySettings, {"auth": "jwt", "jwt_algorithms": "HS256"}, "jwt_secret"),
        (GatewaySettings, {"rate_limits": "bob"}, "rate_limits"),
        (GatewaySettings, {"rate_limits": "bob=fast"}, "rate_limits"),
        (GatewaySettings, {"job_completion_window": "soon"}, "job_completion_window"),
        (GatewaySettings, {"job_completion_window": "8d"}, "job_completion_window"),
        (GatewaySettings, {"job_max_completion_window": "0h"}, "job_max_completion_window"),
    ],
)
def test_a_bad_structured_setting_is_a_config_error_naming_it(
        cls: type[CommonSettings], given: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        cls(**given)


def test_parsed_values_follow_their_text_through_replace() -> None:
    """A supervisor's batcher is its settings with other owned partitions (``replace``): the
    parsed fields are parsed again from the new text, and the rest kept."""
    auto = BatcherSettings(owned_partitions="auto", replicas=3, fallback_variables={"M": "n"})
    one = dataclasses.replace(auto, owned_partitions="1,4")
    assert (one.owned, one.follows_replicas) == ((1, 4), False)
    assert one.fallbacks.of("m") == "n"


def _parsed(cls: type) -> set[str]:
    """The parsed values of a settings class: its cached properties, its bases' included."""
    return {name for klass in cls.__mro__ for name, value in vars(klass).items()
            if isinstance(value, functools.cached_property)}


def test_parsed_values_are_parsed_when_built() -> None:
    """Each parsed value is computed by ``__post_init__``: a bad one is refused when the
    settings are built, not when it is first read."""
    for cls in (CommonSettings, GatewaySettings, BatcherSettings, UpSettings):
        assert _parsed(cls) <= set(vars(cls()))


def test_parsed_values_are_not_settings() -> None:
    """Neither a flag, a variable nor a row of the table; compared through their text."""
    parsed = _parsed(GatewaySettings) | _parsed(BatcherSettings)
    assert not any(not f.init for cls in (GatewaySettings, BatcherSettings)
                   for f in dataclasses.fields(cls))
    assert parsed == {"log_levels", "declared_rollouts", "webhook_hosts", "redis_sentinel_nodes",
                      "api_key_entries", "jwt_algorithm_names", "rate_limit_overrides",
                      "job_completion_window_s", "job_max_completion_window_s", "owned",
                      "follows_replicas", "fallbacks", "declared_cascades", "client_weight_map",
                      "log_rates", "log_redacted"}
    names = {f.name for cls in (GatewaySettings, BatcherSettings, UpSettings)
             for f in settable(cls)}
    assert not parsed & names
    assert "fallback_variables" not in names
    assert not any(f"FERRY_{name.upper()}`" in reference_table() for name in parsed)
    assert BatcherSettings(owned_partitions="0-15") == BatcherSettings(owned_partitions="0-15")
    mapping: Mapping[str, object] = GatewaySettings(rate_limits="bob=1").rate_limit_overrides
    assert list(mapping) == ["bob"]
