"""Ferry's statistics in Triton's shape (``ferry.oip.statistics``) and the batcher's tally of
what it settles (``ferry.batcher.served``): pure code, no servers."""

from __future__ import annotations

from typing import Any

from ferry import keys
from ferry.batcher.executor import Outcome
from ferry.batcher.served import tally
from ferry.oip.statistics import Counters, Drained, Served, with_ferry_figures
from ferry.queue.base import Delivery
from ferry.tasks.record import Status
from ferry.v1.task_pb2 import Task

MS = 1_000_000  # nanoseconds


def counters(served: Served, model: str = "mix") -> Counters:
    """What Redis would hold after one flush of ``served``."""
    drained = served.drain()
    return Counters(drained.fields.get(model, {}),
                    {v: at for (m, v), at in drained.last.items() if m == model})


def triton_answer(*versions: str, model: str = "mix") -> dict[str, Any]:
    """Triton's statistics answer for ``model``'s versions, with figures Ferry must replace."""
    stale = {"count": 7, "ns": 7}
    return {"model_stats": [{
        "name": model, "version": version, "last_inference": 7, "inference_count": 7,
        "execution_count": 7,
        "inference_stats": {name: stale for name in (
            "success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
            "cache_hit", "cache_miss")},
        "batch_stats": [{"batch_size": 9, "compute_infer": stale}],
        "memory_usage": [{"type": "CPU", "id": 0, "byte_size": 42}], "response_stats": {}}
        for version in versions]}


def test_a_task_triton_ran_is_a_success_with_its_queue_and_its_call() -> None:
    served = Served()
    served.ended("mix", "1", ok=True, total_s=0.010, infer_s=0.004)
    figures = counters(served).of(["1"])["1"]
    stats = figures.inference_stats()
    assert stats["success"] == {"count": 1, "ns": 10 * MS}
    assert stats["queue"] == {"count": 1, "ns": 6 * MS}  # admission to the call
    assert stats["compute_infer"] == {"count": 1, "ns": 4 * MS}
    assert stats["compute_input"] == stats["compute_output"] == {"count": 1, "ns": 0}
    assert stats["fail"] == stats["cache_hit"] == stats["cache_miss"] == {"count": 0, "ns": 0}


def test_a_failed_task_counts_only_as_a_failure() -> None:
    served = Served()
    served.ended("mix", "1", ok=False, total_s=0.5)
    stats = counters(served).of(["1"])["1"].inference_stats()
    assert stats["fail"] == {"count": 1, "ns": 500 * MS}
    assert stats["success"]["count"] == stats["queue"]["count"] == 0
    assert stats["compute_infer"]["count"] == 0


def test_a_shared_answer_is_a_success_a_queue_entry_and_a_cache_hit() -> None:
    served = Served()
    served.shared("mix", "1", 0.0003)
    stats = counters(served).of(["1"])["1"].inference_stats()
    assert stats["success"] == stats["cache_hit"] == {"count": 1, "ns": 300_000}
    assert stats["queue"] == {"count": 1, "ns": 0}  # Triton's queue count includes cache hits
    assert stats["compute_infer"]["count"] == 0  # Triton ran nothing for it


def test_calls_count_executions_rows_and_batch_sizes() -> None:
    served = Served()
    served.call("mix", "1", rows=3, seconds=0.002, ended_at=100.0)
    served.call("mix", "1", rows=1, seconds=0.001, ended_at=101.5)
    served.call("mix", "1", rows=3, seconds=0.004, ended_at=99.0)
    figures = counters(served).of(["1"])["1"]
    assert figures.counts["executions.n"] == 3 and figures.counts["rows.n"] == 7
    assert figures.last == 101_500  # the newest end, in ms
    assert figures.batch_stats() == [
        {"batch_size": 1, "compute_input": {"count": 1, "ns": 0},
         "compute_infer": {"count": 1, "ns": 1 * MS}, "compute_output": {"count": 1, "ns": 0}},
        {"batch_size": 3, "compute_input": {"count": 2, "ns": 0},
         "compute_infer": {"count": 2, "ns": 6 * MS}, "compute_output": {"count": 2, "ns": 0}}]


def test_a_drained_tally_merged_back_adds_to_what_came_since() -> None:
    served = Served()
    served.ended("mix", "1", ok=True, total_s=0.002, infer_s=0.001)
    served.call("mix", "1", rows=1, seconds=0.001, ended_at=5.0)
    drained = served.drain()
    assert not len(served)
    served.ended("mix", "1", ok=True, total_s=0.003, infer_s=0.001)
    served.call("mix", "1", rows=1, seconds=0.001, ended_at=4.0)
    served.merge(drained)  # the flush failed: nothing is lost
    figures = counters(served).of(["1"])["1"]
    assert figures.counts["success.n"] == 2 and figures.counts["success.ns"] == 5 * MS
    assert figures.counts["executions.n"] == 2 and figures.last == 5000


def test_figures_without_a_version_count_for_the_newest_listed() -> None:
    found = Counters({"|fail.n": 2, "9|fail.n": 1, "10|fail.n": 1, "3|fail.n": 5},
                     {"": 2000, "10": 1000})
    figures = found.of(["9", "10"])  # numerically: 10 is the newest
    assert figures["10"].counts["fail.n"] == 3 and figures["10"].last == 2000
    assert figures["9"].counts["fail.n"] == 1
    assert set(figures) == {"9", "10"}  # a version Triton no longer lists is left out


def test_triton_answer_carries_ferry_figures_in_its_own_shape() -> None:
    served = Served()
    served.ended("mix", "1", ok=True, total_s=0.010, infer_s=0.004)
    served.call("mix", "1", rows=2, seconds=0.004, ended_at=3.0)
    triton = triton_answer("1", "2")
    answer = with_ferry_figures(triton, {"mix": counters(served)})
    one, two = answer["model_stats"]
    assert [set(s) for s in answer["model_stats"]] == [set(s) for s in triton["model_stats"]]
    assert one["inference_count"] == 2 and one["execution_count"] == 1
    assert one["last_inference"] == 3000
    assert one["inference_stats"]["success"] == {"count": 1, "ns": 10 * MS}
    assert one["batch_stats"][0]["batch_size"] == 2
    assert one["memory_usage"] == [{"type": "CPU", "id": 0, "byte_size": 42}]  # Triton's own
    assert two["inference_count"] == two["execution_count"] == two["last_inference"] == 0
    assert two["batch_stats"] == []
    assert all(d == {"count": 0, "ns": 0} for d in two["inference_stats"].values())
    assert triton["model_stats"][0]["inference_count"] == 7  # Triton's answer is not changed


def test_the_models_named_keep_tritons_own_figures() -> None:
    triton = triton_answer("1", model="step")
    assert with_ferry_figures(triton, {}, tritons={"step"}) == triton


def test_models_ferry_never_served_answer_zeros() -> None:
    answer = with_ferry_figures(triton_answer("1", model="other"), {})
    assert answer["model_stats"][0]["inference_stats"]["success"] == {"count": 0, "ns": 0}


def test_fields_keep_the_version_before_the_figure() -> None:
    served = Served()
    served.ended("m", "12", ok=False, total_s=1.0)
    assert served.drain() == Drained({"m": {"12|fail.n": 1, "12|fail.ns": 10 ** 9}}, {})
    assert keys.served_key("m") == "ferry:served:{m}"
    assert keys.served_last_key("m") == "ferry:served:{m}:last"  # in the same slot


def outcome(status: Status, *, infer_s: float = 0.0, rows: int = 0, version: str = "",
            model: str = "mix", asked: str = "", answered_by: str | None = None,
            enqueued_ms: int = 99_990) -> Outcome:
    task = Task(task_id="t", model=model, model_version=asked, enqueued_at_ms=enqueued_ms)
    return Outcome(Delivery(0, "s", "1-0", b"", task), status, model_version=version,
                   infer_s=infer_s, rows=rows, answered_by=answered_by)


def test_the_batcher_tallies_each_task_and_each_call_once() -> None:
    served = Served()
    tally(served, [outcome(Status.SUCCESS, infer_s=0.004, rows=2, version="1"),
                   outcome(Status.SUCCESS, infer_s=0.004, rows=2, version="1"),
                   outcome(Status.SUCCESS, infer_s=0.003, rows=1, version="1"),  # a split's call
                   outcome(Status.EXPIRED), outcome(Status.FAILED, asked="1"),
                   outcome(Status.CANCELLED)], finished_at=100.0)
    figures = counters(served).of(["1"])["1"]
    stats = figures.inference_stats()
    assert stats["success"] == {"count": 3, "ns": 30 * MS}  # 10 ms each, from admission
    assert stats["compute_infer"] == {"count": 3, "ns": 11 * MS}
    assert stats["fail"]["count"] == 2  # expired (no version: the newest) and failed, not
    assert figures.counts["executions.n"] == 2 and figures.counts["rows.n"] == 3  # cancelled
    assert figures.last == 100_000


def test_a_fallback_answer_counts_for_the_model_that_gave_it() -> None:
    served = Served()
    tally(served, [outcome(Status.SUCCESS, infer_s=0.002, rows=1, version="3", asked="1",
                           answered_by="spare")], finished_at=100.0)
    drained = served.drain()
    assert set(drained.fields) == {"spare"}
    assert drained.fields["spare"]["3|success.n"] == 1
