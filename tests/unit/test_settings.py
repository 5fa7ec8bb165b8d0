"""Settings: flag > FERRY_* variable > default, with type conversion and validation."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ferry.errors import ConfigError
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
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        load(BatcherSettings, None, environ=env)


def test_bad_type_in_flag_raises_config_error() -> None:
    args = parse(BatcherSettings, ["--max-attempts", "three"])
    with pytest.raises(ConfigError, match=r"max_attempts: 'three' is not a valid int"):
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
    assert parse_partitions(settings.owned_partitions, settings.partitions) == (0, 1, 3)


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
        ("1-3,2-4", 8, (1, 2, 3, 4)),
        (" 1 , 3 ,", 8, (1, 3)),
        ("0-15", 16, tuple(range(16))),
    ],
)
def test_parse_partitions(spec: str, total: int, expected: tuple[int, ...]) -> None:
    assert parse_partitions(spec, total) == expected


@pytest.mark.parametrize("spec", ["x", "1-b", "0-3-5", "1.5", "-1", "a-3"])
def test_parse_partitions_syntax_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="is not N or N-M"):
        parse_partitions(spec, 8)


@pytest.mark.parametrize("spec", ["8", "0-8", "3-1", "", ",", " "])
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
    assert set(env) == {"FERRY_" + f.name.upper() for f in dataclasses.fields(BatcherSettings)}
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
               line.endswith("| gateway, batcher, up |") for line in lines)
    assert any(line.startswith("| `FERRY_STATE_DIR` |") and line.endswith("| up |")
               for line in lines)
    assert any(line.startswith("| `FERRY_PORT` |") and line.endswith("| gateway, up |")
               for line in lines)
    names = {f.name for cls in (GatewaySettings, BatcherSettings, UpSettings)
             for f in dataclasses.fields(cls)}
    assert len(lines) == 2 + len(names)




def test_gateway_workers_default_to_one_per_core_and_cannot_be_negative() -> None:
    assert load(GatewaySettings, None, environ={}).workers == 0
    assert load(GatewaySettings, None, environ={"FERRY_WORKERS": "3"}).workers == 3
    with pytest.raises(ConfigError):
        load(GatewaySettings, None, environ={"FERRY_WORKERS": "-1"})


# --- fallback models ------------------------------------------------------------------------------


def test_fallbacks_from_the_list_and_variables() -> None:
    settings = BatcherSettings(fallback_models="moderation=moderation_small, sim-v2 = sim")
    fallbacks = settings.fallbacks({"FERRY_FALLBACK_SIM_V2": "sim_backup",
                                    "FERRY_FALLBACK_OTHER": "other_small",
                                    "FERRY_FALLBACK_EMPTY": " "})
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
