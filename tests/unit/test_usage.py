"""The usage ledger's pure parts, without servers: shares of a call's time, windows and hours,
fields and sums, the bounded client labels, what the executor passes to the completion script,
and ``ferry usage``'s table and CSV."""

from __future__ import annotations

import asyncio
import csv
import io

import pytest
from prometheus_client import CollectorRegistry

from ferry import keys, lua
from ferry.errors import BadRequestError
from ferry.queue.base import Delivery
from ferry.tasks import scripts
from ferry.tasks.base import Completion
from ferry.tasks.record import Status, TaskRecord
from ferry.tasks.redis_store import completion_item
from ferry.usage import ledger
from ferry.usage.cli import as_csv, table
from ferry.usage.labels import OTHER, RERANK_S, ClientLabels
from ferry.usage.ledger import Usage
from ferry.v1.task_pb2 import Task
from tests.unit.test_executor import Backend, Context, Store, deliveries, executor

DAY = 86400


# -- shares of a call's time ------------------------------------------------------------------

@pytest.mark.parametrize("seconds, rows", [(0.0123456, [1, 1, 1]), (0.005, [3, 1, 4, 1, 5]),
                                           (1.0, [1] * 7), (0.0000004, [1, 1])])
def test_shares_add_up_to_the_calls_microseconds(seconds: float, rows: list[int]) -> None:
    shares = ledger.shares_us(seconds, rows)
    assert sum(shares) == round(seconds * 1_000_000)
    for share, weight in zip(shares, rows, strict=True):  # each within a microsecond of exact
        assert abs(share - seconds * 1_000_000 * weight / sum(rows)) < 1


def test_shares_follow_the_rows() -> None:
    assert ledger.shares_us(0.004, [1, 3]) == [1000, 3000]
    assert ledger.shares_us(0.001, [0, 0]) == [0, 0]
    assert ledger.shares_us(0.001, []) == []


# -- windows and hours -------------------------------------------------------------------------

@pytest.mark.parametrize("raw, seconds", [("1h", 3600), ("24h", DAY), ("7d", 7 * DAY),
                                          ("90m", 5400), (" 35d ", 35 * DAY), (None, DAY)])
def test_since_is_a_number_and_a_unit(raw: str | None, seconds: int) -> None:
    assert ledger.parse_since(raw, DAY, keys.LEDGER_TTL_S) == seconds


@pytest.mark.parametrize("raw", ["", "0h", "36d", "1w", "h", "-1h", "1.5h", "24"])
def test_a_window_that_is_not_one_is_a_400(raw: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        ledger.parse_since(raw, DAY, keys.LEDGER_TTL_S)
    assert refused.value.code == "invalid_since"


def test_hours_run_from_the_one_the_start_falls_in_to_now_in_utc() -> None:
    start = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
    assert ledger.hour_of(start) == "2026111811"
    assert ledger.hours_between(start, start + 2 * 3600) == ["2026111811", "2026111812",
                                                              "2026111813"]
    assert ledger.hours_between(7200.0, 7200.0) == ["1970010102"]
    assert ledger.hours_between(7199.0, 7200.0) == ["1970010101", "1970010102"]


# -- fields, clients and sums -----------------------------------------------------------------

def test_a_task_is_charged_to_its_client_anonymous_or_shadow() -> None:
    assert ledger.client_of(Task(client_id="team-a")) == "team-a"
    assert ledger.client_of(Task()) == ledger.ANONYMOUS
    assert ledger.client_of(Task(client_id="", shadow_of="t1")) == ledger.SHADOWS


def test_sums_split_fields_back_and_put_the_most_gpu_time_first() -> None:
    a, b = ledger.field_prefix("a|b:c", "sim"), ledger.field_prefix("z", "sim")
    other_model = ledger.field_prefix("z", "moderation")
    hashes = [{a + "tasks": 2, a + "rows": 2, a + "gpu_us": 10, b + "tasks": 1},
              {b + "gpu_us": 50, b + "rows": 4, other_model + "tasks": 3,
               "stray": 9, a + "bogus": 1}]
    rows = ledger.summed(hashes)
    assert rows == [Usage("z", "sim", 1, 4, 50), Usage("a|b:c", "sim", 2, 2, 10),
                    Usage("z", "moderation", 3, 0, 0)]
    assert ledger.summed(hashes, "moderation") == [Usage("z", "moderation", 3, 0, 0)]
    assert ledger.total(rows) == Usage("", "", 6, 6, 60)


def test_the_report_holds_rows_and_totals() -> None:
    rows = [Usage("a", "sim", 2, 2, 1_500_000)]
    doc = ledger.report(rows, 3600, 7300.0)
    assert doc["from"] == 3600.0 and doc["since_s"] == 3600 and doc["model"] is None
    assert doc["usage"] == [{"client": "a", "model": "sim", "tasks": 2, "rows": 2,
                             "gpu_seconds": 1.5}]
    assert doc["total"] == {"tasks": 2, "rows": 2, "gpu_seconds": 1.5}


# -- what the completion script is given ------------------------------------------------------

def test_an_item_carries_its_client_rows_and_gpu_time_to_the_script() -> None:
    task = Task(task_id="a" * 32, model="sim", client_id="team-a")
    record = TaskRecord(task.task_id, Status.SUCCESS, "sim", 1.0, "1", 2.0, {"x": 1})
    item = completion_item(Completion(Delivery(0, "s", "1-0", b"", task), record,
                                      rows=3, gpu_us=1234))
    assert (item.ledger_field, item.rows, item.gpu_us) == ("team-a\tsim\t", 3, 1234)
    unreadable = completion_item(Completion(Delivery(0, "s", "2-0", b"x", None), None, "bad"))
    assert (unreadable.ledger_field, unreadable.rows, unreadable.gpu_us) == ("", 0, 0)


def test_the_script_counts_each_measure_by_its_python_name() -> None:
    source = lua.source(scripts.COMPLETE)
    for measure in ledger.MEASURES:
        assert f"'{measure}'" in source
    assert "LEDGER_" not in source  # every constant written in


# -- the bounded client labels ----------------------------------------------------------------

def test_the_first_clients_are_named_until_the_set_is_full() -> None:
    labels = ClientLabels(2)
    assert [labels.label(c) for c in ("a", "b", "c", "a", OTHER)] == ["a", "b", OTHER, "a",
                                                                      OTHER]
    assert ClientLabels(0).label("a") == OTHER


def test_a_rerank_names_the_costliest_and_keeps_the_set_bounded() -> None:
    labels = ClientLabels(2, now=0.0)
    for client in ("a", "b", "c"):
        labels.label(client)
    labels.charge("a", 1.0)
    labels.charge("c", 5.0)
    assert not labels.refresh(RERANK_S - 1)  # not yet
    assert labels.label("c") == OTHER
    assert labels.refresh(RERANK_S)
    assert labels.named == {"c", "a"} and labels.label("b") == OTHER
    labels.charge("b", 2.0)
    labels.rerank()
    assert labels.named == {"c", "b"} and len(labels.named) <= labels.limit


def test_a_named_client_without_cost_keeps_its_place_while_there_is_room() -> None:
    labels = ClientLabels(3)
    labels.label("free")
    labels.charge("paying", 1.0)
    labels.rerank()
    assert labels.named == {"paying", "free"}


def test_costs_are_kept_for_a_bounded_number_of_clients() -> None:
    labels = ClientLabels(1)
    for i in range(50):
        labels.charge(f"c{i}", float(i))
    labels.rerank()
    assert labels.named == {"c49"} and len(labels.costs) == 10


# -- the executor's part ----------------------------------------------------------------------

def test_the_executor_gives_each_task_its_share_and_counts_per_client() -> None:
    backend, store, context = Backend(), Store(), Context({"t1"})
    batch = deliveries(4)
    for delivery, client in zip(batch, ("a", "a", "b", ""), strict=True):
        assert delivery.task is not None
        delivery.task.client_id = client
    run = executor(backend, store, context)
    asyncio.run(run.run("m", batch))
    by_task = {c.delivery.task.task_id: (c.rows, c.gpu_us) for c in store.completed
               if c.delivery.task}
    assert by_task["t1"] == (0, 0)  # cancelled: it reached no call
    ran = [by_task[t] for t in ("t0", "t2", "t3")]
    assert [rows for rows, _ in ran] == [1, 1, 1]
    call_us = round(sample(run.metrics.registry, "ferry_infer_seconds_sum") * 1_000_000)
    assert sum(us for _, us in ran) == call_us and all(us >= 0 for _, us in ran)
    tasks = {c: sample(run.metrics.registry, "ferry_client_tasks_total",
                       {"client": c, "model": "m"}) for c in ("a", "b", ledger.ANONYMOUS)}
    assert tasks == {"a": 2.0, "b": 1.0, ledger.ANONYMOUS: 1.0}
    waits = sample(run.metrics.registry, "ferry_client_queue_wait_seconds_count",
                   {"client": "a", "priority": "normal"})
    assert waits == 1.0  # the cancelled task did not depart


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None
           ) -> float:
    value = registry.get_sample_value(name, labels or {"model": "m", "version": "1"})
    assert value is not None, name
    return value


# -- ferry usage's table and CSV --------------------------------------------------------------

REPORT = {"since_s": 86400, "from": 1_795_219_200.0, "until": 1_795_300_000.0, "model": None,
          "usage": [{"client": "team-a", "model": "sim", "tasks": 120, "rows": 120,
                     "gpu_seconds": 0.75},
                    {"client": "(anonymous)", "model": "moderation", "tasks": 3, "rows": 3,
                     "gpu_seconds": 0.25}],
          "total": {"tasks": 123, "rows": 123, "gpu_seconds": 1.0}}


def test_the_table_shows_each_row_its_share_and_the_totals() -> None:
    lines = table(REPORT).splitlines()
    assert lines[0] == "since 2026-11-21 00:00Z (24h), every model"
    assert lines[1].split() == ["client", "model", "tasks", "rows", "gpu_seconds", "share"]
    assert lines[2].split() == ["team-a", "sim", "120", "120", "0.750", "75.0%"]
    assert lines[3].split() == ["(anonymous)", "moderation", "3", "3", "0.250", "25.0%"]
    assert lines[4].split() == ["total", "123", "123", "1.000", "100.0%"]
    assert len({len(line) for line in lines[1:]}) == 1  # columns aligned


def test_an_empty_window_says_so() -> None:
    empty = {**REPORT, "usage": [], "model": "sim",
             "total": {"tasks": 0, "rows": 0, "gpu_seconds": 0.0}}
    assert table(empty).splitlines()[1:] == ["no tasks finished"]
    assert "model sim" in table(empty)


def test_csv_has_a_header_and_a_line_per_row() -> None:
    rows = list(csv.reader(io.StringIO(as_csv(REPORT))))
    assert rows == [["client", "model", "tasks", "rows", "gpu_seconds"],
                    ["team-a", "sim", "120", "120", "0.750000"],
                    ["(anonymous)", "moderation", "3", "3", "0.250000"]]
