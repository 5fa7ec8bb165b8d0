"""Where Triton is: the targets of ``triton_url`` and ``triton_http_url``, and the servers a
name resolves to (``ferry.triton.endpoints``, ``ferry.triton.pool``'s look-ups)."""

from __future__ import annotations

import socket

import pytest

from ferry.batcher.shared_budget import capped
from ferry.errors import ConfigError
from ferry.triton.endpoints import Address, Target, parse_targets, pick_family, resolve
from ferry.triton.grpc_backend import TritonGrpcBackend
from ferry.triton.pool import State, TritonPool


def test_targets_are_host_port_pairs_paired_by_position() -> None:
    assert parse_targets("a:8001, grpc://10.0.0.2:9001", "a:8000,10.0.0.2:9000") == (
        Target("a", 8001, 8000), Target("10.0.0.2", 9001, 9000))
    assert parse_targets("[::1]:8001") == (Target("::1", 8001),)
    assert Address(Target("::1", 8001), "::1").name == "[::1]:8001"


@pytest.mark.parametrize(("grpc", "http", "says"), [
    ("", "", "names no Triton"),
    ("a:8001,", "", "empty entry"),
    ("a:8001;b:8001", "", "'a:8001;b:8001' is not"),
    ("a:0", "", "'a:0' is not"),
    ("a", "", "'a' is not"),
    ("a:1,a:1", "", "names a target twice"),
    ("a:1,b:1", "a:2", "1 entries and triton_url 2"),
    ("a:1", "b:2", "not on triton_url's host"),
])
def test_a_bad_target_list_is_refused_with_what_is_wrong(grpc: str, http: str,
                                                           says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_targets(grpc, http)


def test_a_name_is_one_server_per_address_ipv4_first() -> None:
    assert pick_family([(socket.AF_INET6, "::1"), (socket.AF_INET, "10.0.0.2"),
                        (socket.AF_INET, "10.0.0.1"), (socket.AF_INET, "10.0.0.1")]) == [
        "10.0.0.1", "10.0.0.2"]
    assert pick_family([(socket.AF_INET6, "fd00::2"), (socket.AF_INET6, "fd00::1")]) == [
        "fd00::1", "fd00::2"]


async def test_a_named_target_follows_its_answers() -> None:
    """A server in the answer joins (down until probed); one that leaves it is dropped once
    Ferry has no call there. Real clients, no server behind them: nothing is called here."""
    answers: list[list[tuple[int, str]]] = [
        [(socket.AF_INET, "10.0.0.1"), (socket.AF_INET, "10.0.0.2")],
        [(socket.AF_INET, "10.0.0.2")]]

    async def lookup(host: str, port: int) -> list[tuple[int, str]]:
        assert (host, port) == ("triton-headless", 8001)
        return answers.pop(0)

    target = Target("triton-headless", 8001)
    pool = TritonPool([target], lambda a: TritonGrpcBackend(a.name), lookup=lookup)
    await pool.refresh()
    assert sorted(pool.endpoints) == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert all(e.state is State.DOWN for e in pool.endpoints.values())
    pool.endpoints["10.0.0.2:8001"].state = State.READY
    pool.endpoints["10.0.0.2:8001"].counts["m"] = (0.0, 2)
    await pool.refresh()
    assert sorted(pool.endpoints) == ["10.0.0.2:8001"]
    assert pool.limits("m") == {"10.0.0.2:8001": 2} and pool.instances("m") == 2
    await pool.close()
    assert [a.name for a in await resolve(Target("10.0.0.9", 1), lookup)] == ["10.0.0.9:1"]


def test_the_operators_cap_cuts_the_largest_servers_first() -> None:
    assert capped({"a": 2, "b": 1}, 2) == {"a": 1, "b": 1}
    assert capped({"a": 4, "b": 1}, 3) == {"a": 2, "b": 1}
    assert capped({"a": 1}, 5) == {"a": 1}
