"""``ferry jobs submit``'s progress: rewritten in place on a terminal, a line per step elsewhere."""

from __future__ import annotations

import io
from typing import Any

from ferry.client.records import JobRecord
from ferry.jobs.cli import Shown, listing


def record(status: str, done: int, total: int = 100) -> JobRecord:
    return JobRecord.from_json({
        "job_id": "job_1", "status": status, "model": "m", "priority": "batch",
        "request_counts": {"total": total, "pending": total - done, "completed": done,
                           "failed": 0},
        "progress": {"items_per_s": 5.0}})


def follow(records: list[JobRecord], terminal: bool) -> str:
    out = io.StringIO()
    shown = Shown(out, terminal)
    for each in records:
        shown(each)
    shown.end(records[-1])
    return out.getvalue()


POLLS = [record("queued", 0), record("running", 1), record("running", 4), record("running", 9),
         record("running", 12), record("running", 55), record("running", 56),
         record("completed", 100)]


def test_outside_a_terminal_a_line_per_status_or_tenth_and_no_carriage_returns() -> None:
    text = follow(POLLS, terminal=False)
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert [line.split()[1:3] for line in lines] == [
        ["0/100", "queued"], ["1/100", "running"], ["12/100", "running"],
        ["55/100", "running"], ["100/100", "completed"]]


def test_on_a_terminal_one_line_rewritten_in_place() -> None:
    text = follow(POLLS, terminal=True)
    assert text.count("\r\x1b[K") == len(POLLS) and text.endswith("\n")
    assert text.count("\n") == 1


def test_a_listing_shows_the_status_once() -> None:
    doc: dict[str, Any] = {"data": [{"job_id": "job_1", "status": "completed",
                                     "request_counts": {"total": 1, "pending": 0, "failed": 0},
                                     "progress": {"items_per_s": 1.0}}]}
    line = listing(doc)
    assert line.count("completed") == 1 and line.startswith("job_1  completed  [")
