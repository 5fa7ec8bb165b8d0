"""Structured settings refuse what they cannot read, naming the flag, variable or file: a ';'
between entries, an entry given twice, an empty entry, a malformed one (issue 43: weights
separated by ';' were ignored without a word)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ferry.auth.api_keys import config_line
from ferry.errors import ConfigError
from ferry.settings import (
    BatcherSettings,
    CommonSettings,
    GatewaySettings,
    add_arguments,
    load,
)

SEPARATOR, TWICE, EMPTY = "not ';'", "is given twice", "an entry is empty"
ALICE, BOB = config_line("alice", "fk_alice"), config_line("bob", "fk_bob")
HS = {"FERRY_AUTH": "jwt", "FERRY_JWT_SECRET": "s" * 32}
KEYED = {"FERRY_AUTH": "api_key"}
SIGNED = {"FERRY_WEBHOOK_SECRET": "k"}
RULE = {"m": '{"m": {"review_model": "big", "when": "labels:%s"}}'}

# Every structured setting: (settings, variable, bad text, what the message says, the other
# variables the setting needs to be read at all)
REFUSED: list[tuple[type[CommonSettings], str, str, str, dict[str, str]]] = [
    (GatewaySettings, "CLIENT_WEIGHTS", "batch-jobs=0.2;partner=4", SEPARATOR, {}),
    (GatewaySettings, "CLIENT_WEIGHTS", "a=1,a=2", "'a' is given twice", {}),
    (GatewaySettings, "CLIENT_WEIGHTS", "a=1,", EMPTY, {}),
    (GatewaySettings, "CLIENT_WEIGHTS", "a=1,,b=2", EMPTY, {}),
    (GatewaySettings, "CLIENT_WEIGHTS", ",a=1", EMPTY, {}),
    (GatewaySettings, "CLIENT_WEIGHTS", "a=1 b=2", "is not 'client=weight'", {}),
    (GatewaySettings, "CLIENT_WEIGHTS", "partner", "is not 'client=weight'", {}),
    (GatewaySettings, "RATE_LIMITS", "bob=60;carol=30", SEPARATOR, {}),
    (GatewaySettings, "RATE_LIMITS", "bob=60, bob=30", "'bob' is given twice", {}),
    (GatewaySettings, "RATE_LIMITS", "bob=60,", EMPTY, {}),
    (GatewaySettings, "RATE_LIMITS", "bob=60 carol=30", "is not a client id", {}),
    (GatewaySettings, "API_KEYS", f"{ALICE};{BOB}", SEPARATOR, KEYED),
    (GatewaySettings, "API_KEYS", f"{ALICE},{ALICE}", "a key hash is given twice", KEYED),
    (GatewaySettings, "API_KEYS", f"{ALICE},,{BOB}", EMPTY, KEYED),
    (GatewaySettings, "API_KEYS", f"{ALICE},\n{BOB}", EMPTY, KEYED),
    (GatewaySettings, "API_KEYS", f"{ALICE} {BOB}", "entries are", KEYED),
    (GatewaySettings, "JWT_ALGORITHMS", "HS256;HS384", SEPARATOR, HS),
    (GatewaySettings, "JWT_ALGORITHMS", "HS256,HS256", "'HS256' is given twice", HS),
    (GatewaySettings, "JWT_ALGORITHMS", "HS256,", EMPTY, HS),
    (GatewaySettings, "JOB_SOURCES", "file:///a/;file:///b/", SEPARATOR, {}),
    (GatewaySettings, "JOB_SOURCES", "file:///a/,file:///a", "'file:///a/' is given twice",
     {}),
    (GatewaySettings, "JOB_SOURCES", "file:///a/,", EMPTY, {}),
    (GatewaySettings, "JOB_SOURCES", "file:///a/ file:///b/", "has a space in it", {}),
    (CommonSettings, "WEBHOOK_ALLOWED_HOSTS", "a.example;b.example", SEPARATOR, SIGNED),
    (CommonSettings, "WEBHOOK_ALLOWED_HOSTS", "A.example,a.example", "'a.example' is given "
     "twice", SIGNED),
    (CommonSettings, "WEBHOOK_ALLOWED_HOSTS", "a.example,", EMPTY, SIGNED),
    (CommonSettings, "WEBHOOK_ALLOWED_HOSTS", "https://a.example/",
     "is not 'host' or 'host:port'", SIGNED),
    (CommonSettings, "REDIS_SENTINELS", "s1:26379;s2:26379", SEPARATOR, {}),
    (CommonSettings, "REDIS_SENTINELS", "s1:26379,s1:26379", "'s1:26379' is given twice", {}),
    (CommonSettings, "REDIS_SENTINELS", "s1:26379,", EMPTY, {}),
    (CommonSettings, "REDIS_SENTINELS", "s1:26379 s2:26379", "is not a host name", {}),
    (CommonSettings, "LOG_LEVEL", "INFO;ferry.batches=DEBUG", SEPARATOR, {}),
    (CommonSettings, "LOG_LEVEL", "INFO,ferry.a=DEBUG,ferry.a=ERROR", "'ferry.a' is given "
     "twice", {}),
    (CommonSettings, "LOG_LEVEL", "INFO,", EMPTY, {}),
    (CommonSettings, "LOG_LEVEL", "LOUD", "is not one of", {}),
    (CommonSettings, "ROLLOUTS", '{"m": {"stable": "1"}, "m": {"stable": "2"}}',
     "'m' is given twice", {}),
    (CommonSettings, "ROLLOUTS", '{"m": {"stable": "1", "stable": "2"}}',
     "'stable' is given twice", {}),
    (BatcherSettings, "OWNED_PARTITIONS", "0-3;8", SEPARATOR, {}),
    (BatcherSettings, "OWNED_PARTITIONS", "0-3,2", "partition 2 is given twice", {}),
    (BatcherSettings, "OWNED_PARTITIONS", "0-3,", EMPTY, {}),
    (BatcherSettings, "OWNED_PARTITIONS", "0-3 8", "is not N or N-M", {}),
    (BatcherSettings, "FALLBACK_MODELS", "a=b;c=d", SEPARATOR, {}),
    (BatcherSettings, "FALLBACK_MODELS", "a=b,a=c", "'a' is given twice", {}),
    (BatcherSettings, "FALLBACK_MODELS", "a=b,", EMPTY, {}),
    (BatcherSettings, "FALLBACK_MODELS", "a=b c=d", "is not 'model=other_model'", {}),
    (BatcherSettings, "CASCADES", '{"m": {"review_model": "a"}, "m": {"review_model": "b"}}',
     "'m' is given twice", {}),
    (BatcherSettings, "CASCADES", RULE["m"] % "x;y", SEPARATOR, {}),
    (BatcherSettings, "CASCADES", RULE["m"] % "x,,y", EMPTY, {}),
    (BatcherSettings, "CASCADES", RULE["m"] % "x,x", "'x' is given twice", {}),
]


@pytest.mark.parametrize(("cls", "variable", "text", "said", "needs"), REFUSED,
                         ids=[f"{r[1]}={r[2]!r}" for r in REFUSED])
def test_a_structured_setting_refuses_what_it_cannot_read(
        cls: type[CommonSettings], variable: str, text: str, said: str,
        needs: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=rf"^FERRY_{variable}: ") as refused:
        load(cls, None, environ={**needs, f"FERRY_{variable}": text})
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)  # one line


def test_every_list_setting_refuses_a_semicolon_a_duplicate_and_an_empty_entry() -> None:
    """The audit, kept: each setting that holds entries has the three refusals above."""
    lists = {"CLIENT_WEIGHTS", "RATE_LIMITS", "API_KEYS", "JWT_ALGORITHMS", "JOB_SOURCES",
             "WEBHOOK_ALLOWED_HOSTS", "REDIS_SENTINELS", "LOG_LEVEL", "OWNED_PARTITIONS",
             "FALLBACK_MODELS", "CASCADES"}
    for said in (SEPARATOR, TWICE, EMPTY):
        covered = {variable for _, variable, _, message, _ in REFUSED if said in message}
        assert lists <= covered, (said, lists - covered)
    objects = {variable for _, variable, _, message, _ in REFUSED
               if TWICE in message and variable in ("ROLLOUTS", "CASCADES")}
    assert objects == {"ROLLOUTS", "CASCADES"}


def test_the_flag_and_the_file_are_named_as_given(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, GatewaySettings)
    args = parser.parse_args(["--client-weights", "a=1;b=2"])
    with pytest.raises(ConfigError, match=r"^--client-weights: entries are separated"):
        load(GatewaySettings, args, environ={"FERRY_CLIENT_WEIGHTS": "a=1"})
    keys = tmp_path / "api-keys"
    keys.write_text(f"{ALICE}\n{ALICE}\n")
    with pytest.raises(ConfigError, match=r"^FERRY_API_KEYS_FILE: a key hash is given twice$"):
        load(GatewaySettings, None, environ={**KEYED, "FERRY_API_KEYS_FILE": str(keys)})


def test_a_message_about_several_settings_names_those_given() -> None:
    with pytest.raises(ConfigError, match=r"must be positive \(FERRY_JOB_WINDOW\)$"):
        load(GatewaySettings, None, environ={"FERRY_JOB_WINDOW": "0"})


def test_what_was_accepted_stays_accepted(tmp_path: Path) -> None:
    settings = load(GatewaySettings, None, environ={
        "FERRY_CLIENT_WEIGHTS": " batch-jobs = 0.2 , partner=4 ", "FERRY_RATE_LIMITS": "",
        "FERRY_JOB_SOURCES": "file:///mnt/a/, s3://bucket/p/"})
    assert settings.client_weight_map == {"batch-jobs": 0.2, "partner": 4.0}
    keys = tmp_path / "api-keys"  # a file's blank lines are no entries; a client, two keys
    keys.write_text(f"{ALICE}\n\n{config_line('alice', 'fk_new')}\r\n{BOB}:3\n\n")
    keyed = load(GatewaySettings, None, environ={**KEYED, "FERRY_API_KEYS_FILE": str(keys)})
    assert [(k.client_id, k.weight) for k in keyed.api_key_entries] == [
        ("alice", None), ("alice", None), ("bob", 3.0)]
    batcher = load(BatcherSettings, None, environ={
        "FERRY_LOG_LEVEL": "WARNING, ferry.batches = debug", "FERRY_OWNED_PARTITIONS": "7,0-3"})
    assert batcher.owned == (0, 1, 2, 3, 7)
    assert batcher.log_levels.named == {"ferry.batches": "DEBUG"}


@pytest.mark.parametrize(("text", "value"), [("true", True), ("On", True), ("1", True),
                                             ("false", False), ("0", False), ("", False)])
def test_a_switch_is_true_or_false(text: str, value: bool) -> None:
    assert load(CommonSettings, None, environ={"FERRY_TRITON_SSL": text}).triton_ssl is value


@pytest.mark.parametrize("text", ["ture", "enabled", "2"])
def test_a_switch_that_is_neither_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=rf"^FERRY_TRITON_SSL: '{text}' is not true or false"):
        load(CommonSettings, None, environ={"FERRY_TRITON_SSL": text})
