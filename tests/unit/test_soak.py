"""The chaos soak's pure parts: its fault plan, its judgement of answers, its figures."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from loadtest.soak.client import retryable
from loadtest.soak.config import parse_args, parse_faults
from loadtest.soak.diagnose import MAX_DIAGNOSED, sample_of
from loadtest.soak.ledger import Tracked, expected_output, judge, payload
from loadtest.soak.memory import Sample, slope_per_minute, trends
from loadtest.soak.plan import KINDS, Action, Kind, Target, backoff_s, deal, fault_plan
from loadtest.soak.report import latency_by_minute, percentile, when


@pytest.mark.parametrize("seed", range(50))
def test_every_kind_is_dealt_once_per_deck_and_never_the_same_target_twice_in_a_row(
        seed: int) -> None:
    dealt = deal(random.Random(seed), 3 * len(KINDS))
    for deck in range(3):
        assert sorted(dealt[deck * len(KINDS):(deck + 1) * len(KINDS)]) == sorted(KINDS)
    assert all(a.target is not b.target for a, b in itertools.pairwise(dealt))


@pytest.mark.parametrize("seed", range(20))
def test_a_60_s_plan_at_4_5_s_injects_every_kind_inside_the_run(seed: int) -> None:
    plan = fault_plan(seed, 60, 4.5)
    assert Counter(f.kind for f in plan) == Counter(KINDS)
    assert all(3 < f.at_s < 57 for f in plan)
    assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)
    assert all(2 <= f.pause_s <= 4 for f in plan)


def test_the_plan_is_reproducible_from_its_seed_and_respects_the_kinds_asked() -> None:
    assert fault_plan(3, 120, 8) == fault_plan(3, 120, 8)
    assert fault_plan(3, 120, 8) != fault_plan(4, 120, 8)
    only = (Kind(Target.REDIS, Action.STOP),)
    assert {f.kind for f in fault_plan(1, 60, 10, kinds=only)} == set(only)
    assert fault_plan(1, 60, 0) == [] and fault_plan(1, 60, 5, kinds=()) == []


def test_fault_kinds_read_as_action_target() -> None:
    assert Kind.parse("stop-redis") == Kind(Target.REDIS, Action.STOP)
    assert parse_faults("all") == KINDS and parse_faults("none") == ()
    assert parse_faults("kill-gateway,term-triton") == (Kind(Target.GATEWAY, Action.KILL),
                                                        Kind(Target.TRITON, Action.TERM))
    with pytest.raises(Exception, match="fault kinds are"):
        parse_faults("kill-everything")


def test_flags_are_bounded() -> None:
    assert parse_args(["--rate", "40", "--seed", "7"]).rate == 40
    with pytest.raises(SystemExit):
        parse_args(["--duration-s", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--share", "1.5"])


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]


def test_overload_unavailability_and_silence_are_retried_but_refusals_are_not() -> None:
    assert retryable("503 not_replicated") and retryable("429 backlog_full")
    assert retryable("TimeoutError") and retryable("ConnectionRefusedError")
    assert not retryable("400 empty_input") and not retryable("404 unknown_model")


def _task(index: int, **fields: object) -> Tracked:
    data = payload("n", index)
    task = Tracked(index, f"k{index}", data, float(index))
    for name, value in fields.items():
        setattr(task, name, value)
    return task


def _success(task: Tracked, finished_at: float = 1.0) -> dict[str, object]:
    return {"task_id": task.task_id, "status": "SUCCESS", "finished_at": finished_at,
            "output": expected_output(task.data)}


def test_judgement_of_each_way_an_answer_can_go() -> None:
    right = _task(0, task_id="a")
    right.first_final = right.reread = _success(right)
    wrong = _task(1, task_id="b")
    wrong.first_final = {**_success(wrong), "output": expected_output(b"other")}
    wrong.reread = wrong.first_final
    twice = _task(2, task_id="c")
    twice.first_final, twice.reread = _success(twice, 1.0), _success(twice, 2.0)
    vanished = _task(3, task_id="d", reread_status="404")
    vanished.first_final = _success(vanished)
    never = _task(4, task_id="e", last_seen="PENDING")
    silent = _task(5, task_id="f")
    silent.first_final = silent.reread = {"status": "FAILED", "finished_at": 1.0}
    refused = _task(6)  # never accepted: not judged
    verdicts = judge([right, wrong, twice, vanished, never, silent, refused])
    assert verdicts.accepted == 6
    assert verdicts.finished == Counter({"SUCCESS": 4, "FAILED": 1})
    assert [(t.task_id, why) for t, why in verdicts.wrong] == [("b", "wrong_output"),
                                                               ("f", "no_reason")]
    assert [t.task_id for t in verdicts.duplicated] == ["c"]
    assert [(t.task_id, why.split(" (")[0]) for t, why in verdicts.lost] == [
        ("d", "vanished"), ("e", "never_final")]


def test_a_second_answer_that_is_wrong_counts_as_wrong() -> None:
    task = _task(0, task_id="a")
    task.first_final = _success(task)
    task.reread = {**_success(task, 2.0), "output": expected_output(b"other")}
    verdicts = judge([task])
    assert [why for _, why in verdicts.wrong] == ["wrong_output (read at the end)"]
    assert verdicts.duplicated == [task]


def test_a_final_record_that_is_pending_again_counts_as_lost() -> None:
    task = _task(0, task_id="a")
    task.first_final = _success(task)
    task.reread = {"status": "PENDING"}
    assert [why for _, why in judge([task]).lost] == ["reverted (final, then PENDING)"]


def test_lost_tasks_to_diagnose_are_taken_from_every_kind_of_loss() -> None:
    lost = [(_task(i, task_id=str(i)), "vanished (x)") for i in range(30)]
    lost.append((_task(99, task_id="99"), "never_final (last seen 404)"))
    picked = sample_of(lost)
    assert len(picked) == MAX_DIAGNOSED
    assert any(why.startswith("never_final") for _, why in picked)


def test_lost_tasks_are_counted_by_when_they_were_sent() -> None:
    assert when([_task(1), _task(3), _task(12)]) == {"0-5": 2, "10-15": 1}


def test_percentiles_and_latency_per_minute() -> None:
    assert percentile([5, 1, 3, 2, 4], 50) == 3 and percentile(list(range(1, 101)), 99) == 99
    early, late = _task(1, final_seen_s=1.5), _task(70, final_seen_s=70.2)
    rows = latency_by_minute([early, late, _task(80)])
    assert [(r["minute"], r["answered"], r["p99_ms"]) for r in rows] == [(0, 1, 500.0),
                                                                           (1, 1, 200.0)]


def test_memory_trend_is_the_slope_per_minute_past_each_series_warm_up() -> None:
    assert slope_per_minute([(0, 10), (30, 11), (60, 12)]) == pytest.approx(2.0)
    assert slope_per_minute([(0, 10), (60, 12)]) is None
    samples = [Sample(t, "gateway-0", 7, 50 + (100 if t < 10 else t / 60)) for t in range(0, 70, 5)]
    samples += [Sample(t, "gateway-0", 8, 40) for t in range(70, 100, 5)]  # restarted
    found = {t.pid: t for t in trends(samples, warmup_s=10)}
    assert found[7].mib_per_min == pytest.approx(1.0) and found[7].samples == 12
    assert found[8].mib_per_min == 0 and found[8].samples == 4
