"""Capacity reports: how batchers' measurements are written and merged for the gateways."""

from __future__ import annotations

import pytest

from ferry.priority import BY_URGENCY, Priority
from ferry.tasks.base import Admission
from ferry.tasks.capacity import Capacity, decode, encode, freshest


def report(capacity: Capacity, at: float) -> bytes:
    return encode(capacity, at).encode()


def test_encode_round_trips() -> None:
    capacity = Capacity(120.5, 0.066, "open", "sim_small", 12.0)
    assert decode(report(capacity, 1000.0)) == (capacity, 1000.0)
    assert decode(report(Capacity(10, 0.1), 5.0))[0].fallback == ""


def test_freshest_takes_the_highest_fresh_rate_per_model() -> None:
    reports = {
        b"sim|a": report(Capacity(100, 0.05), 995.0),
        b"sim|b": report(Capacity(150, 0.04), 999.0),
        b"sim|c": report(Capacity(900, 0.01), 900.0),  # stale: its batcher is gone
        b"other|a": report(Capacity(7, 1.0), 999.0),
        b"junk|x": b"not a report",
    }
    merged = freshest(reports, now=1000.0)
    assert merged == {"sim": Capacity(150, 0.04), "other": Capacity(7, 1.0)}


def test_a_breaker_is_open_only_where_every_batcher_has_it_open() -> None:
    some = {b"m|a": report(Capacity(10, 0.1, "open", "", 20.0), 999.0),
            b"m|b": report(Capacity(10, 0.1, "closed"), 999.0)}
    assert freshest(some, 1000.0)["m"].breaker == "closed"
    every = {b"m|a": report(Capacity(10, 0.1, "open", "", 20.0), 999.0),
             b"m|b": report(Capacity(0, 0.0, "open", "", 5.0), 999.0)}
    merged = freshest(every, 1000.0)["m"]
    assert (merged.breaker, merged.retry_after_s) == ("open", 5.0)


def test_each_version_has_its_own_breaker_merged_across_batchers() -> None:
    a = Capacity(10, 0.1, "closed", "", 0.0, (("1", "closed", 0.0), ("3", "open", 20.0)))
    b = Capacity(12, 0.1, "closed", "", 0.0, (("3", "open", 7.5),))
    c = Capacity(12, 0.1, "closed", "", 0.0, (("2", "open", 3.0), ("3", "half_open", 0.0)))
    assert decode(report(a, 50.0)) == (a, 50.0)
    merged = freshest({b"m|a": report(a, 999.0), b"m|b": report(b, 999.0)}, 1000.0)["m"]
    assert merged.breaker_of("3") == ("open", 7.5)
    assert merged.breaker_of("1") == merged.breaker_of("") == ("closed", 0.0)
    assert merged.breaker_of("9") == ("closed", 0.0)  # never called: nothing to refuse
    merged = freshest({b"m|a": report(a, 999.0), b"m|c": report(c, 999.0)}, 1000.0)["m"]
    assert merged.breaker_of("3") == ("half_open", 0.0)  # one batcher probes it
    assert merged.breaker_of("2") == ("open", 3.0)


def test_a_report_without_versions_still_reads() -> None:
    """A batcher of the previous version writes six fields: its one breaker is the policy's."""
    capacity, at = decode(b"10.000 0.100000 999.000 open 4.0 -")
    assert (capacity.breaker_of(""), capacity.versions, at) == (("open", 4.0), (), 999.0)
    with pytest.raises(ValueError):
        decode(b"10.000 0.100000 999.000 open 4.0 - - extra")


def test_model_names_may_hold_the_separator() -> None:
    merged = freshest({b"a|b|batcher-1": report(Capacity(5, 0.2), 10.0)}, 10.0)
    assert list(merged) == ["a|b"]


# --- admission limits -----------------------------------------------------------------------------


def test_the_limit_is_split_over_partitions() -> None:
    admission = Admission(limit=43, partitions=16)
    assert [admission.partition_limit(p) for p in range(16)] == [3] * 11 + [2] * 5
    assert sum(admission.partition_limit(p) for p in range(16)) == 43
    assert Admission(limit=5, partitions=16).partition_limit(15) == 1  # never zero
    assert Admission(limit=0, partitions=16).partition_limit(0) == 0  # no limit


def test_refusals_say_what_and_when_to_retry() -> None:
    admission = Admission(limit=100, rate=50.0, batch_s=0.1, timeout_s=2.0, partitions=16)
    full = admission.backlog_full("sim", Priority.LOW, 10)
    assert (full.status, full.code) == (429, "backlog_full")
    assert "160" in full.message and "low" in full.message
    assert full.retry_after_s == pytest.approx(60 / 50)
    slow = admission.too_slow("sim", Priority.HIGH, 3.5)
    assert (slow.status, slow.code) == (429, "deadline_unmeetable")
    assert "3.50 s" in slow.message and "2 s" in slow.message
    assert slow.headers() == [(b"retry-after", b"2")]


def test_priority_shares_leave_room_for_the_more_urgent() -> None:
    shares = [p.backlog_share for p in BY_URGENCY]
    assert shares == sorted(shares, reverse=True)
    assert Priority.HIGH.backlog_share == 1.0
