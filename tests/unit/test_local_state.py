"""ferry.stack.state: the client commands find ``ferry up``'s state from anywhere under it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import httpx
import pytest

from ferry.inference_log.cli import redis_environ
from ferry.rollouts.cli import refusal, token, token_hint
from ferry.settings import CommonSettings, UpSettings, load
from ferry.stack.banner import redis_line
from ferry.stack.state import ADMIN_TOKEN_FILE, REDIS_ENV_FILE, REDIS_URL_FILE, kept, state_dir


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A directory ``ferry up`` ran in: its .ferry with a token and a Redis URL, and a folder
    deep below it."""
    state = tmp_path / "repo" / ".ferry"
    state.mkdir(parents=True)
    (tmp_path / "repo" / ".git").mkdir()  # a repository's root: the search ends there
    (state / ADMIN_TOKEN_FILE).write_text("a-token-of-the-local-stack\n")
    (state / REDIS_URL_FILE).write_text("redis://127.0.0.1:6390/0\n")
    (tmp_path / "repo" / "docs" / "deep").mkdir(parents=True)
    return tmp_path / "repo"


def test_the_nearest_state_directory_is_found_here_or_above(checkout: Path,
                                                            tmp_path: Path) -> None:
    assert state_dir({}, checkout) == checkout / ".ferry"
    assert state_dir({}, checkout / "docs" / "deep") == checkout / ".ferry"
    assert kept(ADMIN_TOKEN_FILE, {}, checkout / "docs") == (
        "a-token-of-the-local-stack", checkout / ".ferry" / ADMIN_TOKEN_FILE)
    inner = checkout / "docs" / "deep" / "other-repo"  # a repository of its own, inside
    (inner / ".git").mkdir(parents=True)
    assert state_dir({}, inner) == inner / ".ferry"  # none up to its root: its own
    assert kept(ADMIN_TOKEN_FILE, {}, inner) == ("", inner / ".ferry" / ADMIN_TOKEN_FILE)


def test_a_state_directory_of_another_user_is_not_taken(checkout: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("changing a directory's owner needs root (this machine's CI runs as root)")
    os.chown(checkout / ".ferry", 12345, 12345)
    assert state_dir({}, checkout / "docs") == checkout / "docs" / ".ferry"


def test_ferry_state_dir_names_it_absolute_as_it_is_and_relative_looked_for(
        checkout: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "other-state"
    assert state_dir({"FERRY_STATE_DIR": str(elsewhere)}, checkout) == elsewhere
    (checkout / "state2").mkdir()
    assert state_dir({"FERRY_STATE_DIR": "state2"}, checkout / "docs" / "deep") == \
        checkout / "state2"
    assert state_dir({"FERRY_STATE_DIR": ""}, checkout / "docs") == checkout / ".ferry"


def test_the_commands_read_the_token_and_the_redis_url_from_below_the_checkout(
        checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(checkout / "docs" / "deep")
    monkeypatch.delenv("FERRY_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("FERRY_STATE_DIR", raising=False)
    assert token(None) == "a-token-of-the-local-stack"
    assert token("given") == "given"
    monkeypatch.setenv("FERRY_ADMIN_TOKEN", "from-the-environment")
    assert token(None) == "from-the-environment"

    args = argparse.Namespace(redis_url=None, state_dir=None)
    assert redis_environ(args, {}).get("FERRY_REDIS_URL") == "redis://127.0.0.1:6390/0"
    args.state_dir = str(checkout / "nowhere")
    assert redis_environ(args, {}).get("FERRY_REDIS_URL") is None


def test_a_refused_admin_call_says_where_its_token_came_from_or_was_looked_for(
        checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERRY_STATE_DIR", raising=False)
    monkeypatch.delenv("FERRY_ADMIN_TOKEN", raising=False)
    monkeypatch.chdir(checkout / "docs")
    assert token_hint(None) == (f"the token in {checkout / '.ferry' / ADMIN_TOKEN_FILE} was "
                                "refused: the one ferry up kept there, for its gateway")
    assert token_hint("x") == "the token given with --token was refused"
    (checkout / ".ferry" / ADMIN_TOKEN_FILE).unlink()
    hint = token_hint(None)
    assert "--token, FERRY_ADMIN_TOKEN" in hint
    assert str(checkout / ".ferry" / ADMIN_TOKEN_FILE) in hint
    monkeypatch.setenv("FERRY_ADMIN_TOKEN", "wrong")
    assert token_hint(None) == "the token in FERRY_ADMIN_TOKEN was refused"


def test_an_admin_calls_refusal_is_one_line_with_the_tokens_source_on_a_401(
        checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERRY_STATE_DIR", raising=False)
    monkeypatch.delenv("FERRY_ADMIN_TOKEN", raising=False)
    monkeypatch.chdir(checkout)
    body = {"error": {"code": "invalid_admin_token", "message": "send the admin token"}}
    unauthorized = httpx.Response(401, json=body)
    assert refusal(unauthorized, unauthorized.json(), "x") == (
        "HTTP 401 invalid_admin_token: send the admin token (the token given with --token "
        "was refused)")
    missing = httpx.Response(404, json={"error": {"code": "unknown_model", "message": "m?"}})
    assert refusal(missing, missing.json(), None) == "HTTP 404 unknown_model: m?"
    plain = httpx.Response(502, text="bad gateway")
    assert refusal(plain, {}, None) == "HTTP 502 : bad gateway"


def test_a_stack_on_sentinels_is_read_through_them_and_named_so(checkout: Path) -> None:
    """``ferry up`` on Sentinel keeps the sentinels beside the URL (whose host is not used),
    ``ferry log tail`` reads Redis through them, and the banner names them, not the URL."""
    (checkout / ".ferry" / REDIS_ENV_FILE).write_text(
        "FERRY_REDIS_SENTINELS=127.0.0.1:26401\nFERRY_REDIS_SENTINEL_MASTER=mymaster\n")
    args = argparse.Namespace(redis_url=None, state_dir=str(checkout / ".ferry"))
    settings = load(CommonSettings, None, redis_environ(args, {}))
    assert (settings.redis_url, settings.redis_sentinels, settings.redis_sentinel_master) == (
        "redis://127.0.0.1:6390/0", "127.0.0.1:26401", "mymaster")
    # A Redis named in the environment is the one read, with none of ferry up's kept.
    named = load(CommonSettings, None, redis_environ(
        args, {"FERRY_REDIS_URL": "redis://127.0.0.1:7000/0"}))
    assert (named.redis_url, named.redis_sentinels) == ("redis://127.0.0.1:7000/0", "")
    up = load(UpSettings, None, {"FERRY_REDIS_URL": "redis://ignored/0",
                                 "FERRY_REDIS_SENTINELS": "127.0.0.1:26401"})
    assert redis_line(up) == "master 'mymaster' of sentinels 127.0.0.1:26401"
    assert redis_line(load(UpSettings, None, {"FERRY_REDIS_URL": "redis://127.0.0.1:7000/0",
                                              "FERRY_REDIS_CLUSTER": "true"})) == \
        "redis://127.0.0.1:7000/0 (a Redis Cluster)"
