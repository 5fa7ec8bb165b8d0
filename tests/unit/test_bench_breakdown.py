"""The breakdown's arithmetic (loadtest.bench.breakdown): per-task figures from two snapshots
of each process's CPU and context switches and of Redis's own command counts."""

from __future__ import annotations

import os

from loadtest.bench.breakdown import Snapshot, report, switches


def test_the_report_gives_each_process_and_redis_command_per_task() -> None:
    before = Snapshot({"gateway": 1.0, "batcher": 2.0, "redis": 0.5},
                      {"gateway": 100, "batcher": 50, "redis": 10},
                      {"evalsha": (10, 1_000.0), "xreadgroup": (5, 100.0)})
    after = Snapshot({"gateway": 1.4, "batcher": 2.2, "redis": 0.6},
                     {"gateway": 600, "batcher": 250, "redis": 310},
                     {"evalsha": (210, 21_000.0), "xreadgroup": (55, 3_600.0),
                      "ping": (1, 5.0)})
    text = report(before, after, 100, (8.04, 15.96)).splitlines()
    assert text[0] == "100 tasks, p50 8.0 ms, p99 16.0 ms"
    assert text[1] == "CPU per task: gateway 4,000 + batcher 2,000 + redis 1,000 = 7,000 µs"
    assert text[2] == "context switches per task: gateway 5.00, batcher 2.00, redis 3.00"
    rows = [line for line in text if line.startswith("| ") and "per task" not in line]
    assert rows == ["| evalsha | 2.00 | 100 |", "| xreadgroup | 0.50 | 70 |",
                    "| ping | 0.01 | 5 |"]  # by Redis's time on each, the most first


def test_context_switches_count_every_thread_of_a_live_process() -> None:
    first = switches(os.getpid())
    os.sched_yield()
    assert switches(os.getpid()) >= first > 0
    assert switches(2**22 + 12345) == 0  # no such process
