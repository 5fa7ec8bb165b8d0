"""The recovery part's reading of a run (``loadtest.bench.backlog``, ``recovery_report``): when
a backlog is back to normal, what counts as recovered, and the section it writes."""

from __future__ import annotations

import datetime
import json
import math

import pytest

from loadtest.bench import backlog
from loadtest.bench.recovery_report import FaultResult, Injected, lines, result_of, taken_over
from loadtest.soak.ledger import Attempt, Tracked, expected_output, payload

FAULT_AT = 4.0
FAULT_WALL = 1_000_000.0  # the wall clock at the fault: records carry Unix seconds


def test_the_clients_backlog_counts_what_was_sent_and_has_not_ended() -> None:
    series = dict(backlog.outstanding([(0.0, 0.25), (0.1, None), (0.3, 0.35)]))
    assert series[0.0] == 1 and series[0.1] == 2 and series[0.2] == 2
    assert series[0.3] == 2  # the first ended at 0.25, the third began at 0.3
    assert series[0.4] == 1 and series[1.3] == 1  # one never ended: outstanding to the end
    assert max(series) == pytest.approx(1.35, abs=0.11)  # HOLD_S past the last event


def test_back_to_normal_means_at_or_under_the_level_before_the_fault_for_the_hold() -> None:
    series = [(t / 10, level) for t, level in enumerate(
        [3, 5, 4, 3, 9, 9, 4, 9, 3, 3, 3, 3, 3, 3, 3, 3, 3])]
    assert backlog.normal_level(series, 0.4, pre_s=0.4) == 5  # the most in 0.0 .. 0.3
    # 0.6 dips to 4 but rises again at 0.7: back to normal from 0.8 on, held 0.5 s
    assert backlog.back_to_normal(series, 5, after=0.4, hold_s=0.5) == 0.8
    assert backlog.back_to_normal(series, 5, after=0.4, hold_s=5.0) is None  # runs out
    assert backlog.normal_level(series, 0.0) is None  # no sample before the fault


def test_recovery_waits_for_every_earlier_request_then_each_backlog() -> None:
    spans = [(1.0, 1.2), (3.9, 6.0), (4.5, 4.7)]
    depth = [(t / 10, 2.0 if t < 40 or t > 65 else 10.0) for t in range(100)]
    found = backlog.recovery(spans, FAULT_AT, {"depth": depth})
    assert found.earlier_ended_s == 2.0  # the request sent at 3.9 ended at 6.0
    assert found.backlogs_s == {"depth": 2.6}  # searched from 6.0: under 2 again at 6.6
    assert found.total_s == 2.6
    never = backlog.recovery([(3.9, None), *spans], FAULT_AT, {"depth": depth})
    assert never.earlier_ended_s is None and never.total_s is None


def test_latency_around_the_fault_is_of_the_requests_sent_until_the_recovery() -> None:
    sent = [(2.0, 0.1), (3.5, 0.2), (4.5, 3.0), (6.0, 0.1), (9.0, 0.1), (4.8, None)]
    around = backlog.around(sent, FAULT_AT, recovery_s=2.5)
    assert (around.count, around.max_ms) == (3, 3000.0)  # 3.5, 4.5 and 6.0; 4.8 unanswered
    assert backlog.around(sent, FAULT_AT, recovery_s=None).count == 4  # until the end
    assert math.isnan(backlog.Latency.of([]).p99_ms)


def _task(index: int, sent: float, seconds: float | None, *, created: float = FAULT_WALL - 1,
          outcomes: tuple[str, ...] = ("200",)) -> Tracked:
    data = payload("r", index)
    task = Tracked(index, f"key-{index}", data, sent,
                   [Attempt(sent + 0.01 * n, n % 2, o) for n, o in enumerate(outcomes)])
    if seconds is not None or outcomes[-1] in ("200", "202"):
        task.task_id = f"{index:032x}"
    if seconds is not None:
        task.first_final = {"status": "SUCCESS", "output": expected_output(data),
                            "created_at": created, "finished_at": created + seconds}
        task.final_seen_s = sent + seconds
        task.reread = task.first_final
    return task


def run_tasks() -> list[Tracked]:
    """20/s for 8 s answered in 0.1 s; those sent in the 0.5 s before the fault wait until
    6.0; two whose gateway broke are answered after a retry: one it had admitted, one not."""
    tasks = [_task(i, i / 20, 6.0 - i / 20 if 3.5 <= i / 20 < FAULT_AT else 0.1)
             for i in range(160)]
    tasks[81] = _task(81, 4.05, 0.3, created=FAULT_WALL - 0.5,
                      outcomes=("ConnectionError", "200"))
    tasks[82] = _task(82, 4.1, 0.3, created=FAULT_WALL + 0.2,
                      outcomes=("ConnectionError", "503 unavailable", "200"))
    return tasks


def depth_samples() -> list[tuple[float, float]]:
    return [(t / 10, 3.0 if t < 40 or t >= 62 else 12.0) for t in range(95)]


def test_a_faults_figures_from_its_tasks_and_its_queue_depth() -> None:
    result = result_of(run_tasks(), Injected(FAULT_AT, FAULT_WALL, {"back_after_s": 1.2}),
                       depth_samples(), fault="kill-gateway", what="gateway kill -9",
                       rate=20.0, gave_up=0, created=160)
    assert (result.sent, result.accepted, result.lost, result.wrong) == (160, 160, 0, 0)
    assert result.parts_s == {"answered, every request sent before it": 2.0,  # at 6.0
                              "queue depth": 2.2,  # at 3 again from 6.2
                              "clients' backlog": 2.0}  # 2 or 3 outstanding from 6.0
    assert result.recovery_s == 2.2
    assert (result.broken, result.found) == (2, 1)
    assert result.saw == {"ConnectionError": 2, "503 unavailable": 1}
    assert result.around.max_ms == 2500.0 and result.before.p99_ms == 100.0


def test_a_task_never_answered_is_lost_and_the_fault_never_recovered() -> None:
    tasks = run_tasks()
    tasks[70] = _task(70, 3.5, None)  # accepted (202), never final
    result = result_of(tasks, Injected(FAULT_AT, FAULT_WALL), depth_samples(),
                       fault="kill-batcher", what="batcher kill -9", rate=20.0, gave_up=0,
                       created=160)
    assert result.lost == 1 and result.recovery_s is None
    text = "\n".join(lines([result], "note"))
    assert "| batcher kill -9 | 160 | 160 (160 tasks created) | **1** | **0** |" in text
    assert "**not within the run**" in text


def test_the_section_and_its_notes() -> None:
    result = result_of(run_tasks(), Injected(FAULT_AT, FAULT_WALL, {"back_after_s": 1.2}),
                       depth_samples(), fault="kill-gateway", what="gateway kill -9",
                       rate=20.0, gave_up=3, created=None)
    text = "\n".join(lines([result], "Measured by `x`."))
    assert text.startswith("## Recovery: what each fault costs\n\nMeasured by `x`.")
    assert "| gateway kill -9 | 160 | 160 | **0** | **0** | ConnectionError 2, " \
           "503 unavailable 1 | 100 / 2,500 / 2,500 (" in text
    assert "| 100 | **2.2** | 2.0 / 2.2 / 2.0 |" in text
    assert "started again, ready 1.2 s after the fault" in text
    assert "2 requests' connections broke; retried with the same Idempotency-Key at the other " \
           "gateway, 1 found the task the broken one had admitted" in text
    assert "3 submissions given up by the client" in text
    again = FaultResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result


def test_a_quick_run_is_not_shown_as_measured() -> None:
    result = result_of(run_tasks(), Injected(FAULT_AT, FAULT_WALL), depth_samples(),
                       fault="kill-batcher", what="batcher kill -9", rate=20.0, gave_up=0,
                       created=160, measured=False)
    text = lines([result], "A smoke run. **Not a measurement**.")
    assert text[2] == "A smoke run. **Not a measurement**."
    assert text[4] == "| fault | requests | accepted | lost | recovery s |"
    assert not any("p99" in line for line in text)


def test_takeovers_by_lease_are_read_from_the_batchers_logs_after_the_fault() -> None:
    line = ("{} INFO ferry.batcher.reader: took over {} task(s) of batcher vm-1-abc, whose "
            "lease ran out")
    since = datetime.datetime(2026, 11, 27, 3, 12, 40, 125000).timestamp()
    logs = ["\n".join([line.format("2026-11-27 03:12:30,000", 9),  # before the fault
                        "2026-11-27 03:12:41,000 INFO ferry.batcher.reader: took over 4 "
                        "task(s) left idle",  # the idle backstop: not by lease
                        line.format("2026-11-27 03:12:42,131", 26)]),
            line.format("2026-11-27 03:12:43,000", 3)]
    assert taken_over(logs, since) == {"taken_over_tasks": 29, "taken_over_after_s": 2.01}
    assert taken_over(["nothing"], since) == {}
