"""When a parked reader reads ahead for the next batch (``ferry.rules.readahead``)."""

from __future__ import annotations

import pytest

from ferry.rules import readahead
from ferry.rules.readahead import FRESH_S, LEAD_MAX_S, LEAD_MIN_S, READS_PER_STRETCH


def test_the_lead_is_a_read_and_a_millisecond_within_bounds() -> None:
    assert readahead.lead(0.0015) == pytest.approx(0.0025)
    assert readahead.lead(0.0) == LEAD_MIN_S
    assert readahead.lead(0.050) == LEAD_MAX_S  # a slow read does not read far ahead


def test_a_lead_and_a_fresh_window_that_keep_a_late_high_priority_task_within_5_ms() -> None:
    assert LEAD_MAX_S < FRESH_S <= 0.005


def test_it_reads_a_lead_before_the_first_batch_at_triton_is_expected_to_end() -> None:
    assert readahead.next_read([10.2, 10.1], 0.003, None, 0) == pytest.approx(10.097)


def test_nothing_at_triton_with_a_known_end_means_no_read_ahead() -> None:
    assert readahead.next_read([], 0.003, None, 0) is None


def test_a_read_ahead_for_an_earlier_stretch_does_not_count_for_this_one() -> None:
    assert readahead.next_read([10.1], 0.003, 9.9, 1) == pytest.approx(10.097)


def test_a_call_running_late_is_read_for_again_before_the_read_goes_stale() -> None:
    # read ahead at 10.097 for an end at 10.1; the call runs on past it
    again = readahead.next_read([10.1], 0.003, 10.097, 1)
    assert again is not None
    assert again == pytest.approx(10.097 + FRESH_S - 0.003)
    assert readahead.fresh(10.097, again + 0.002)  # still fresh while the new read runs


def test_a_call_far_past_its_fit_stops_the_read_aheads() -> None:
    assert readahead.next_read([10.1], 0.003, 10.2, READS_PER_STRETCH) is None


def test_fresh_means_started_at_most_fresh_s_ago() -> None:
    assert readahead.fresh(10.0, 10.0 + FRESH_S - 1e-9)
    assert not readahead.fresh(10.0, 10.0 + FRESH_S + 0.0001)
    assert not readahead.fresh(None, 10.0)
    assert not readahead.fresh(10.0, 9.9)  # a clock that went back says nothing


def test_the_reads_average_moves_a_fifth_of_the_way_to_the_latest() -> None:
    assert readahead.average(0.002, 0.007) == pytest.approx(0.003)
