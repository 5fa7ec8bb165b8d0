"""Query strings of the ``/v1`` routes: a parameter the route does not take, or one given twice,
is a 400 that names it and the parameters the route takes."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import pytest

from ferry.errors import ClientError
from ferry.gateway.hot import CANCEL_QUERY, RESULT_QUERY, SUBMIT_QUERY
from ferry.gateway.query import MAX_SHOWN, checked_query, parse_query, query_pairs
from ferry.gateway.schemas import CANCEL_DOC, RESULT_DOC, SUBMIT_DOC

ACCEPTED = frozenset({"model", "priority"})
ROUTE = "POST /v1/inference"


def refused(raw: bytes, accepted: frozenset[str] = ACCEPTED) -> ClientError:
    with pytest.raises(ClientError) as info:
        parse_query(raw, accepted, ROUTE)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(("raw", "expected"), [
    (b"", {}),
    (b"model=sim", {"model": "sim"}),
    (b"model=sim&priority=high", {"model": "sim", "priority": "high"}),
    (b"priority=", {"priority": ""}),  # an empty value is a value, for its route to judge
    (b"priority", {"priority": ""}),
    (b"mod%65l=a%20b", {"model": "a b"}),  # names and values are percent-decoded
    (b"model=sim&&", {"model": "sim"}),
])
def test_accepted_parameters_are_read(raw: bytes, expected: dict[str, str]) -> None:
    assert parse_query(raw, ACCEPTED, ROUTE) == expected


@pytest.mark.parametrize("raw", [b"bogus=1", b"model=sim&bogus=1", b"Model=sim",
                                 b"bogus", b"model=sim&bogus="])
def test_an_unknown_parameter_is_refused_naming_it_and_the_accepted_ones(raw: bytes) -> None:
    error = refused(raw)
    assert error.code == "unknown_parameter"
    name = raw.split(b"&")[-1].split(b"=")[0].decode()
    assert f"{name!r}" in error.message
    assert f"{ROUTE} takes 'model', 'priority'" in error.message


def test_a_route_that_takes_none_says_so() -> None:
    error = refused(b"x=1", frozenset())
    assert error.code == "unknown_parameter"
    assert error.message == f"unknown query parameter(s) 'x'; {ROUTE} takes no query parameters"


def test_many_unknown_names_are_listed_in_part_and_counted() -> None:
    names = [f"p{i:02}" for i in range(MAX_SHOWN + 3)]
    error = refused("&".join(f"{n}=1" for n in names).encode())
    assert all(repr(n) in error.message for n in names[:MAX_SHOWN])
    assert repr(names[MAX_SHOWN]) not in error.message
    assert "and 3 more" in error.message


def test_a_long_unknown_name_is_clipped() -> None:
    error = refused(b"x" * 5000 + b"=1")
    assert len(error.message) < 300
    assert error.message.endswith(f"{ROUTE} takes 'model', 'priority'")


@pytest.mark.parametrize("raw", [b"model=a&model=b", b"model=a&model=a", b"model&model=",
                                 b"priority=high&model=a&priority=low"])
def test_a_repeated_parameter_is_refused(raw: bytes) -> None:
    error = refused(raw)
    assert error.code == "invalid_parameter"
    assert "given more than once" in error.message
    repeated = "'priority'" if b"priority=low" in raw else "'model'"
    assert f"query parameter(s) {repeated} given" in error.message


def test_an_unknown_parameter_is_named_before_a_repeated_one() -> None:
    assert refused(b"model=a&model=b&bogus=1").code == "unknown_parameter"


def test_pairs_from_a_parsed_query_are_checked_alike() -> None:
    assert checked_query([("model", "sim")], ACCEPTED, ROUTE) == {"model": "sim"}
    with pytest.raises(ClientError, match="'bogus'"):
        checked_query([("bogus", "1")], ACCEPTED, ROUTE)


@pytest.mark.parametrize("text", [
    "", "model=sim", "a=1&&b", "a", "a=", "=v", "=", "&", "a=b=c", "x+y=%20z+w", "%E2%98%83=1",
    "a=%zz", "a=%E2%98", "a=%", "a=1;b=2", "a=%26&b=%3D", "caf\u00e9=\u00e9", "a&a=&a=1",
])
def test_pairs_are_read_as_the_standard_library_reads_them(text: str) -> None:
    assert query_pairs(text) == parse_qsl(text, keep_blank_values=True)


@pytest.mark.parametrize(("doc", "query"), [(SUBMIT_DOC, SUBMIT_QUERY),
                                            (RESULT_DOC, RESULT_QUERY), (CANCEL_DOC, CANCEL_QUERY)])
def test_the_hot_routes_document_the_query_parameters_they_take(
        doc: dict[str, Any], query: tuple[frozenset[str], str]) -> None:
    assert {p["name"] for p in doc["parameters"] if p["in"] == "query"} == query[0]
