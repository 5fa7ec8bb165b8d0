"""``ferry settings --effective SERVICE``: every setting in effect, where it came from and what a
structured one was read as; secrets masked; what the service would refuse, refused."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.auth.api_keys import config_line
from ferry.errors import ConfigError
from ferry.settings import (
    BatcherSettings,
    GatewaySettings,
    UpSettings,
    add_arguments,
    effective_table,
    load,
)
from ferry.settings.fields import settable

FERRY = Path(sys.executable).parent / "ferry"
SECRET = "hunter2-" + "x" * 32
WEIGHTS = "batch-jobs=0.2,partner=4"


def rows(table: str) -> dict[str, list[str]]:
    """The table's cells by variable: value, from, read as."""
    found = {}
    for line in table.splitlines():
        if line.startswith("| `FERRY_"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            found[cells[0].strip("`")] = cells[1:]
    return found


def test_every_setting_has_a_row_with_its_value_and_where_it_came_from(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, GatewaySettings)
    public = tmp_path / "public.pem"
    public.write_text("-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n")
    table = effective_table(GatewaySettings, parser.parse_args(["--port", "9001"]), {
        "FERRY_PORT": "9002", "FERRY_CLIENT_WEIGHTS": WEIGHTS, "FERRY_AUTH": "jwt",
        "FERRY_JWT_PUBLIC_KEY_FILE": str(public), "FERRY_MAX_BATCH": "8"})
    found = rows(table)
    assert set(found) == {f"FERRY_{f.name.upper()}" for f in settable(GatewaySettings)}
    assert found["FERRY_PORT"][:2] == ["`9001`", "`--port`"]
    assert found["FERRY_CLIENT_WEIGHTS"] == [
        f"`'{WEIGHTS}'`", "`FERRY_CLIENT_WEIGHTS`",
        "batch-jobs: 0.2, partner: 4; any other client: 1"]
    assert found["FERRY_JWT_PUBLIC_KEY"][:2] == ["*masked*", "`FERRY_JWT_PUBLIC_KEY_FILE`"]
    assert found["FERRY_JWT_ALGORITHMS"] == ["`'RS256'`", "default", "RS256"]
    assert found["FERRY_HOST"] == ["`'127.0.0.1'`", "default", ""]
    assert "- `FERRY_PORT`: `--port` wins over it" in table
    assert "- `FERRY_MAX_BATCH`: not a setting of `ferry gateway`" in table  # a batcher's


def test_secrets_are_masked(tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text(SECRET + "\n")
    entry = config_line("alice", SECRET)
    table = effective_table(GatewaySettings, None, {
        "FERRY_REDIS_URL": f"redis://ferry:{SECRET}@redis:6379/0",
        "FERRY_JWT_JWKS_URL": f"https://idp.example/keys?token={SECRET}&x=1",
        "FERRY_REDIS_PASSWORD": SECRET, "FERRY_REDIS_SENTINEL_PASSWORD": SECRET,
        "FERRY_WEBHOOK_SECRET": SECRET, "FERRY_S3_ACCESS_KEY_ID": SECRET,
        "FERRY_S3_SECRET_ACCESS_KEY": SECRET, "FERRY_ADMIN_TOKEN_FILE": str(secret_file),
        "FERRY_AUTH": "api_key", "FERRY_API_KEYS": f"{entry}:3"})
    assert SECRET not in table
    assert entry.split(":")[1] not in table  # not even the key's hash
    found = rows(table)
    assert found["FERRY_REDIS_URL"][0] == "`'redis://ferry:*masked*@redis:6379/0'`"
    assert found["FERRY_JWT_JWKS_URL"][0] == \
        "`'https://idp.example/keys?token=*masked*&x=1'`"
    for name in ("REDIS_PASSWORD", "REDIS_SENTINEL_PASSWORD", "WEBHOOK_SECRET", "API_KEYS",
                 "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY", "ADMIN_TOKEN"):
        assert found[f"FERRY_{name}"][0] == "*masked*", name
    assert found["FERRY_API_KEYS"][2] == "alice (weight 3)"  # the weights, not the keys
    assert found["FERRY_JWT_SECRET"][0] == "`''`"  # unset: shown as such


def test_every_setting_named_like_a_secret_is_declared_one() -> None:
    named = {f.name for cls in (GatewaySettings, BatcherSettings, UpSettings)
             for f in settable(cls)
             if any(word in f.name for word in ("password", "secret", "token", "api_key",
                                                "access_key"))}
    declared = {f.name for cls in (GatewaySettings, BatcherSettings, UpSettings)
                for f in settable(cls) if f.metadata["secret"]}
    assert named == declared


def test_a_batchers_structured_settings_and_fallback_variables() -> None:
    table = effective_table(BatcherSettings, None, {
        "FERRY_OWNED_PARTITIONS": "0-3,8,10-11", "FERRY_FALLBACK_MODELS": "big=small",
        "FERRY_FALLBACK_SIM_V2": "sim", "FERRY_LOG_LEVEL": "warning,ferry.batches=debug",
        "FERRY_CLIENT_WEIGHTS": WEIGHTS})
    found = rows(table)
    assert found["FERRY_OWNED_PARTITIONS"][2] == "0-3, 8, 10-11"
    assert found["FERRY_FALLBACK_MODELS"][2] == "big → small"
    assert found["FERRY_LOG_LEVEL"][2] == "WARNING, ferry.batches: DEBUG"
    assert found["FERRY_FALLBACK_SIM_V2"][:2] == ["`'sim'`", "`FERRY_FALLBACK_SIM_V2`"]
    assert "- `FERRY_CLIENT_WEIGHTS`: not a setting of `ferry batcher`" in table


def test_what_the_service_refuses_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^FERRY_CLIENT_WEIGHTS: entries are separated"):
        effective_table(GatewaySettings, None, {"FERRY_CLIENT_WEIGHTS": "a=1;b=2"})


# --- the command itself ---------------------------------------------------------------------


def ferry(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``.venv/bin/ferry argv`` with these ``FERRY_*`` variables and no others."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    return subprocess.run([str(FERRY), *argv], env={**clean, **env}, capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_command_shows_the_weights_in_effect_and_no_secret() -> None:
    done = ferry(["settings", "--effective", "gateway", "--rate-limits", "bob=60/5"], {
        "FERRY_CLIENT_WEIGHTS": WEIGHTS, "FERRY_REDIS_URL": f"redis://:{SECRET}@r:6379/0",
        "FERRY_ADMIN_TOKEN": SECRET})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    found = rows(done.stdout)
    assert found["FERRY_CLIENT_WEIGHTS"][2] == "batch-jobs: 0.2, partner: 4; any other client: 1"
    assert found["FERRY_RATE_LIMITS"][1:] == ["`--rate-limits`", "bob: 60/min, bursts of 5"]
    assert SECRET not in done.stdout
    assert ferry(["settings"], {"FERRY_CLIENT_WEIGHTS": WEIGHTS}).stdout.startswith(
        "| variable | flag | default | meaning | used by |")  # the defaults' table, as before


@pytest.mark.parametrize("argv", [["settings", "--effective", "gateway"], ["gateway"]])
def test_the_command_and_the_service_refuse_a_semicolon_with_one_line(argv: list[str]) -> None:
    done = ferry(argv, {"FERRY_CLIENT_WEIGHTS": "batch-jobs=0.2;partner=4",
                        "FERRY_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 2
    said = (done.stdout + done.stderr).splitlines()
    assert said == [f"ferry {argv[0]}: FERRY_CLIENT_WEIGHTS: entries are separated by ',', "
                    "not ';'"]


def test_the_command_needs_a_service_to_show_what_is_in_effect() -> None:
    done = ferry(["settings", "--effective"], {})
    assert done.returncode == 2
    assert "argument --effective: expected one argument" in done.stderr


def test_a_retired_setting_left_set_is_named_with_why_and_warned_of_at_start(
        caplog: pytest.LogCaptureFixture) -> None:
    environ = {"FERRY_REDIS_MAX_CONNECTIONS": "64", "FERRY_REDIS_POOL_TIMEOUT_S": "10"}
    table = effective_table(GatewaySettings, None, environ)
    assert ("- `FERRY_REDIS_MAX_CONNECTIONS`: retired on 2026-11-28: each process opens one "
            "multiplexed connection per Redis server") in table
    assert "- `FERRY_REDIS_POOL_TIMEOUT_S`: retired on 2026-11-28" in table
    with caplog.at_level("WARNING", logger="ferry.settings.loading"):
        settings = load(BatcherSettings, None, environ)
    assert settings.redis_url  # it starts: a retired variable is not an error
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "FERRY_REDIS_MAX_CONNECTIONS is set, and not read",
        "FERRY_REDIS_POOL_TIMEOUT_S is set, and not read"]
