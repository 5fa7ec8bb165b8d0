"""Authentication and rate-limit configuration, without servers."""

from __future__ import annotations

import time

import jwt
import pytest

from ferry import keys
from ferry.access import ANONYMOUS, Caller
from ferry.auth import api_keys
from ferry.auth.base import Credential, Identity, check_key_source, parse_algorithms
from ferry.auth.jwt import JwtAuthenticator
from ferry.auth.rate_limit import Rate, parse_overrides
from ferry.errors import ConfigError, ForbiddenError, UnauthorizedError
from ferry.tasks.base import Owner, partition_share


@pytest.mark.parametrize(("credential", "token"), [
    (Credential(), None),
    (Credential("Bearer abc"), "abc"),
    (Credential("bearer  abc "), "abc"),
    (Credential(None, "key"), "key"),
    (Credential("Bearer other", "key"), "key"),  # X-API-Key wins: it names a key outright
])
def test_the_presented_credential(credential: Credential, token: str | None) -> None:
    assert credential.bearer() == token


@pytest.mark.parametrize("authorization", ["Basic YWxpY2U6cHc=", "Bearer", "Bearer   ", "abc"])
def test_an_authorization_that_is_not_bearer_is_refused(authorization: str) -> None:
    with pytest.raises(UnauthorizedError) as refused:
        Credential(authorization).bearer()
    assert refused.value.status == 401 and refused.value.presented


def test_a_refusal_challenges_for_a_bearer_credential() -> None:
    assert UnauthorizedError("x", "y").headers() == [
        (b"www-authenticate", b'Bearer realm="ferry"')]
    assert UnauthorizedError("x", "y", presented=True).headers() == [
        (b"www-authenticate", b'Bearer realm="ferry", error="invalid_token"')]


async def test_api_keys_are_kept_as_hashes_and_map_to_clients() -> None:
    key = api_keys.new_key()
    line = api_keys.config_line("alice", key)
    assert key not in line and line == f"alice:{api_keys.key_hash(key)}"
    entries = api_keys.parse_keys(f"{line}\n{api_keys.config_line('bob', 'fk_b')}")
    authenticator = api_keys.ApiKeyAuthenticator(entries)
    assert await authenticator.authenticate(Credential(f"Bearer {key}")) == Identity("alice")
    assert await authenticator.authenticate(Credential(None, "fk_b")) == Identity("bob")
    for wrong in (key[:-1], key + "x", "", "fk_c"):
        with pytest.raises(UnauthorizedError):
            await authenticator.authenticate(Credential(None, wrong))


@pytest.mark.parametrize("spec", ["", "alice", "alice:abc", "al ice:" + "0" * 64,
                                  "alice:" + "z" * 64, "alice:" + "0" * 64 + ":0",
                                  "alice:" + "0" * 64 + ":-1", "alice:" + "0" * 64 + ":x"])
def test_unusable_api_key_entries_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError):
        api_keys.parse_keys(spec)


def test_jwt_algorithms_are_pinned_and_never_mixed() -> None:
    assert parse_algorithms("RS256, ES256") == ("RS256", "ES256")
    for spec in ("none", "", "RS256,HS256", "HS256,none", "rs256"):
        with pytest.raises(ConfigError):
            parse_algorithms(spec)


def test_each_jwt_algorithm_family_needs_its_key() -> None:
    check_key_source(("HS256",), "x" * 32, "", "")
    check_key_source(("RS256",), "", "", "https://idp.example/jwks.json")
    with pytest.raises(ConfigError):
        check_key_source(("HS256",), "short", "", "")
    with pytest.raises(ConfigError):
        check_key_source(("ES256",), "x" * 32, "", "")  # a secret is no public key


def test_per_client_rates() -> None:
    assert parse_overrides("") == {}
    assert parse_overrides("alice=60, bob=0, carol=600/20, dan=30000") == {
        "alice": Rate(60, 6), "bob": Rate(0, 1), "carol": Rate(600, 20), "dan": Rate(30000, 100)}
    assert parse_overrides("alice=60, carol=600/20", default_burst=50) == {
        "alice": Rate(60, 50), "carol": Rate(600, 20)}  # FERRY_RATE_LIMIT_BURST, when set
    assert Rate(60, 5).interval_ms == 1000.0 and Rate(60, 5).policy == b"60;w=60;burst=5"
    for spec in ("alice", "alice=x", "=5", "alice=-1", "alice=5/0"):
        with pytest.raises(ConfigError):
            parse_overrides(spec)


@pytest.mark.parametrize(("per_min", "burst"), [(30, 3), (5, 1), (0, 1), (600, 60),
                                                 (1000, 100), (100_000, 100)])
def test_a_rate_without_a_burst_scales_its_burst_with_the_rate(per_min: int, burst: int) -> None:
    assert Rate.of(per_min) == Rate(per_min, burst)
    assert Rate.of(per_min, 7) == Rate(per_min, 7)  # a burst given is kept


def test_an_authenticated_caller_speaks_only_for_itself() -> None:
    assert ANONYMOUS.client_for("anyone") == "anyone"  # authentication off: the body says
    caller = Caller("alice")
    assert caller.client_for("") == "alice" and caller.client_for("alice") == "alice"
    with pytest.raises(ForbiddenError):
        caller.client_for("bob")


def test_an_owner_limit_is_counted_per_partition() -> None:
    assert Owner("alice").field == ""  # no limit: nothing counted
    owner = Owner("alice", max_pending=35)
    assert owner.field == keys.client_backlog_field("alice") == "@alice"
    assert [owner.pending_limit(p, 16) for p in (0, 2, 3, 15)] == [3, 3, 2, 2]
    assert sum(owner.pending_limit(p, 16) for p in range(16)) == 35
    assert partition_share(0, 16, 0) == 0 and partition_share(3, 16, 15) == 1


async def test_an_api_key_entry_may_give_its_clients_fair_share_weight() -> None:
    entries = api_keys.parse_keys(f"partner:{api_keys.key_hash('fk_p')}:4\n"
                                  f"a:b:{api_keys.key_hash('fk_ab')}:0.5\n"
                                  f"plain:{api_keys.key_hash('fk_x')}")
    authenticator = api_keys.ApiKeyAuthenticator(entries)
    assert await authenticator.authenticate(Credential(None, "fk_p")) == Identity("partner", 4.0)
    assert await authenticator.authenticate(Credential(None, "fk_ab")) == Identity("a:b", 0.5)
    assert await authenticator.authenticate(Credential(None, "fk_x")) == Identity("plain")


async def test_a_jwt_claim_may_give_its_clients_fair_share_weight() -> None:
    authenticator = JwtAuthenticator(algorithms=("HS256",), secret="s" * 32,
                                     weight_claim="ferry_weight")
    try:
        def token(**claims: object) -> Credential:
            body = {"sub": "team-a", "exp": int(time.time()) + 60, **claims}
            return Credential(f"Bearer {jwt.encode(body, 's' * 32, algorithm='HS256')}")

        assert await authenticator.authenticate(token(ferry_weight=3)) == Identity("team-a", 3.0)
        assert await authenticator.authenticate(token()) == Identity("team-a")
        for wrong in (0, -2, "3", True, 2_000_000):
            with pytest.raises(UnauthorizedError, match="ferry_weight"):
                await authenticator.authenticate(token(ferry_weight=wrong))
    finally:
        await authenticator.close()
