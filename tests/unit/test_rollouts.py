"""The rollouts' pure rules: the sticky split, the guard, per-version windows, the shadow
comparison and the cascade's conditions, without servers."""

from __future__ import annotations

import argparse
import dataclasses
import io

import orjson
import pytest

from ferry.cli import build_parser
from ferry.errors import (
    BadRequestError,
    ConfigError,
    ForbiddenError,
    RedisConnectionError,
    UnauthorizedError,
)
from ferry.gateway.admin import AdminToken
from ferry.gateway.versions import Versions
from ferry.rollouts import latency
from ferry.rollouts.cascade import parse_cascades, pending_review, wants_review
from ferry.rollouts.cli import declaration, render, when
from ferry.rollouts.cli import run as client_run
from ferry.rollouts.compare import Comparison, compare, kind_of
from ferry.rollouts.guard import decide
from ferry.rollouts.rollout import Pick, Rollout, Sticky, amended, declared, parse_declared
from ferry.rollouts.store import Pair, comparison_report
from ferry.rollouts.window import BUCKET_S, Figures, Tally, bin_of, figures, quantile, upper_edge

CANARY = declared("m", {"stable": "1", "candidate": "2", "share": 25}, now=1000.0)


def test_the_split_is_sticky_and_close_to_the_share() -> None:
    picks = [CANARY.pick(f"client-{i}").version for i in range(20_000)]
    assert abs(picks.count("2") / len(picks) - 0.25) < 0.015
    assert [CANARY.pick(f"client-{i}").version for i in range(100)] == picks[:100]
    wider = dataclasses.replace(CANARY, share=50)
    moved = [i for i in range(2000) if picks[i] == "2" and wider.pick(f"client-{i}").version
             != "2"]
    assert moved == []  # a larger share keeps every key that was on the candidate


def test_no_key_splits_at_random_and_an_idle_rollout_sends_all_to_stable() -> None:
    assert CANARY.pick("", rand=0.1).version == "2"
    assert CANARY.pick("", rand=0.9).version == "1"
    assert CANARY.rolled_back(2000.0).pick("anyone").role == "stable"
    assert Rollout("m").pick("x").role == "policy"
    promoted = CANARY.promoted(2000.0)
    assert (promoted.stable, promoted.candidate, promoted.previous) == ("2", "", "1")
    assert promoted.generation == CANARY.generation + 1


def test_shadows_copy_a_share_of_the_stable_requests_only() -> None:
    shadowed = dataclasses.replace(CANARY, shadow=40)
    assert shadowed.shadowed_version("1", 0.39) and not shadowed.shadowed_version("1", 0.41)
    assert not shadowed.shadowed_version("2", 0.0)  # the candidate's own requests
    assert not CANARY.shadowed_version("1", 0.0)  # shadow 0


@pytest.mark.parametrize(("doc", "wrong"), [
    ({"stable": "1", "candidate": "1"}, "differ"),
    ({"candidate": "2"}, "stable version beside"),
    ({"stable": "v1"}, "version number"),
    ({"stable": "1", "share": 120}, "percentages"),
    ({"stable": "1", "sticky": "cookie"}, "sticky"),
    ({"stable": "1", "steps": [0, 50]}, "steps"),
    ({"stable": "1", "colour": "red"}, "unknown rollout field"),
    ({"stable": "1", "share": "lots"}, "rollout:"),
    ({"stable": "1", "compare": {"kind": "fuzzy"}}, "compare takes kind"),
])
def test_a_rollout_that_cannot_be_served_is_refused_naming_why(doc: dict[str, object],
                                                               wrong: str) -> None:
    with pytest.raises(BadRequestError) as info:
        declared("m", doc, 0.0)
    assert wrong in info.value.message


def test_settings_declare_rollouts_as_json() -> None:
    assert parse_declared("") == {}
    assert parse_declared('{"m": {"stable": "1"}}') == {"m": {"stable": "1"}}
    for bad in ("[1]", "{", '{"m": {"stable": "one"}}'):
        with pytest.raises(ConfigError):
            parse_declared(bad)


def calls(*buckets: dict[int, list[float]]) -> Figures:
    """Figures from Triton calls, one tally bucket per argument: ``{rows: [each call's ms]}``."""
    tally = Tally()
    for index, bucket in enumerate(buckets):
        for rows, times in bucket.items():
            for ms in times:
                tally.call("m", "1", 1000.0 + BUCKET_S * index, rows=rows, seconds=ms / 1000)
    return figures(fields for _, fields in sorted(tally.drain().items()))


def fig(requests: int, errors: int = 0, triton_ms: float = 10.0, rows: int = 16,
        calls_made: int = 40) -> Figures:
    made = calls({rows: [triton_ms] * calls_made})
    return dataclasses.replace(made, requests=requests, errors=errors,
                               triton_p50_s=triton_ms / 2000, triton_p99_s=triton_ms / 1000)


def test_the_guard_rolls_back_on_errors_or_latency_over_enough_requests() -> None:
    rollout = dataclasses.replace(CANARY, min_requests=100)
    assert decide(rollout, fig(1000), fig(99, errors=99), 1010).action == "hold"
    failing = decide(rollout, fig(1000, errors=10), fig(100, errors=3), 1010)
    assert failing.action == "rollback" and "error rate 3.00%" in failing.reason
    assert decide(rollout, fig(1000, errors=10), fig(100, errors=1), 1010).action == "hold"
    slow = decide(rollout, fig(1000, triton_ms=10), fig(100, triton_ms=21), 1010)
    assert slow.action == "rollback" and "median call" in slow.reason, slow.reason
    assert decide(rollout, fig(1000, triton_ms=10), fig(100, triton_ms=15), 1010).action == \
        "hold"  # 1.44 x, within 1.5 x (read from 20%-wide bins)
    small = decide(rollout, fig(1000, triton_ms=1), fig(100, triton_ms=4), 1010)
    assert small.action == "hold"  # 4 x, but only 3 ms slower: within latency_slack_ms


def test_the_guard_rolls_back_at_once_when_the_candidates_breaker_is_open() -> None:
    rollout = dataclasses.replace(CANARY, min_requests=1000)  # far from enough requests
    opened = decide(rollout, fig(100), fig(30, errors=30), 1010, candidate_breaker="open")
    assert opened.action == "rollback" and "circuit breaker is open" in opened.reason
    assert decide(rollout, fig(100), fig(30), 1010, "half_open").action == "hold"
    manual = dataclasses.replace(rollout, auto=False)
    assert decide(manual, fig(100), fig(30), 1010, "open").action == "hold"


def test_latency_compares_calls_of_like_sizes_not_the_p99() -> None:
    """A small share's small batches are quicker than the stable's big ones, and one slow call
    in a few dozen is the machine's: neither is the candidate's fault."""
    rollout = dataclasses.replace(CANARY, min_requests=10)
    stable = calls({1: [5.0] * 30, 32: [8.0] * 200})
    unlucky = calls({1: [5.2] * 27 + [60.0] * 3})  # same model: a p99 of 60 ms
    assert unlucky.calls.calls == 30
    assert decide(rollout, stable, dataclasses.replace(unlucky, requests=30), 1010).action \
        == "hold"
    slower = calls({1: [5.0 + 80] * 30})
    verdict = decide(rollout, stable, dataclasses.replace(slower, requests=30), 1010)
    assert verdict.action == "rollback" and "over 30 calls" in verdict.reason, verdict.reason


def test_latency_uses_the_stables_fitted_line_where_it_has_no_calls_of_that_size() -> None:
    stable = calls({8: [5.0 + 0.5 * 8] * 40, 64: [5.0 + 0.5 * 64] * 40})  # 5 + 0.5 B ms
    like = calls({2: [6.0] * 25})  # what the line says for 2 rows
    found = latency.compare(stable.calls, like.calls, stable.buckets)
    assert found is not None and 0.8 < found.ratio < 1.25
    assert latency.compare(stable.calls, calls({2: [6.0] * 19}).calls, ()) is None  # too few


def test_a_noisy_stable_widens_the_margin() -> None:
    """The stable's own buckets disagreeing with its window by 1.6x: a candidate 2x slower is
    within the ratio times that noise (1.5 x 1.6), 3x is not."""
    quiet_stable = calls({4: [10.0] * 20}, {4: [10.0] * 20})
    noisy_stable = calls({4: [10.0] * 20}, {4: [16.0] * 20})
    found = latency.compare(quiet_stable.calls, calls({4: [10.0] * 25}).calls,
                            quiet_stable.buckets)
    assert found is not None and found.noise == 1.0
    rollout = dataclasses.replace(CANARY, min_requests=10)
    twice, thrice = calls({4: [20.0] * 25}), calls({4: [30.0] * 25})
    assert decide(rollout, quiet_stable, dataclasses.replace(twice, requests=25),
                  1010).action == "rollback"
    assert decide(rollout, noisy_stable, dataclasses.replace(twice, requests=25),
                  1010).action == "hold"
    assert decide(rollout, noisy_stable, dataclasses.replace(thrice, requests=25),
                  1010).action == "rollback"


def test_the_guard_steps_up_after_holding_then_promotes() -> None:
    rollout = dataclasses.replace(CANARY, min_requests=10, hold_s=60, share=5)
    assert decide(rollout, fig(100), fig(10), 1059).action == "hold"
    step = decide(rollout, fig(100), fig(10), 1061)
    assert (step.action, step.share) == ("step", 25)
    last = dataclasses.replace(rollout, share=50)
    assert decide(last, fig(100), fig(10), 1061).action == "promote"
    manual = dataclasses.replace(rollout, auto=False)
    assert decide(manual, fig(100), fig(10, errors=10), 1061).action == "hold"


def test_windows_merge_tallies_and_read_quantiles_from_bins() -> None:
    one, two = Tally(), Tally()
    for _ in range(98):
        one.add("m", "1", 1000.0, error=False, queue_s=0.010, triton_s=0.020)
    for _ in range(2):
        two.add("m", "1", 1003.0, error=True, queue_s=2.0, triton_s=0.5)
    drained = [one.drain(), two.drain()]
    assert len(one) == 0 and list(drained[0]) == [("m", "1", 1000 // BUCKET_S * BUCKET_S)]
    merged = figures([fields for part in drained for fields in part.values()])
    assert (merged.requests, merged.errors) == (100, 2)
    assert 0.020 <= merged.triton_p50_s <= 0.020 * 1.2
    assert 0.5 <= merged.triton_p99_s <= 0.6 and merged.error_rate == 0.02
    assert quantile({}, 0.99) == 0.0 and upper_edge(bin_of(0.0001)) >= 0.0001


def test_shadows_count_as_requests_but_not_in_the_versions_times() -> None:
    tally = Tally()
    tally.add("m", "2", 1000.0, error=False, queue_s=0.01, triton_s=0.01)
    tally.add("m", "2", 1000.0, error=True, queue_s=9.0, triton_s=0.0, shadow=True)
    tally.call("m", "2", 1000.0, rows=3, seconds=0.01)
    merged = figures(tally.drain().values())
    assert (merged.requests, merged.errors, merged.shadows) == (2, 1, 1)
    assert merged.queue_p99_s < 0.02  # the shadow's 9 s wait at batch priority is not counted
    assert (merged.calls.calls, merged.calls.mean_rows(2)) == (1, 3.0)
    assert merged.to_json()["calls"] == 1


def test_a_failed_flush_keeps_the_tally() -> None:
    tally = Tally()
    tally.add("m", "2", 10.0, error=False, queue_s=0.1, triton_s=0.0)
    drained = tally.drain()
    tally.merge(drained)
    tally.merge(drained)
    assert dict(tally.drain()[("m", "2", 10)]) == {"n": 2, f"q{bin_of(0.1)}": 2}


def test_moderation_answers_agree_on_labels_and_the_unsafe_decision() -> None:
    face = {"detections": [{"label": "FACE", "score": 0.9}], "unsafe": False}
    lower = {"detections": [{"label": "FACE", "score": 0.6}], "unsafe": False}
    none = {"detections": [], "unsafe": False}
    how = Comparison("moderation")
    assert compare({"D": face}, {"D": lower}, how).agree
    differs = compare({"D": face}, {"D": none}, how)
    assert not differs.agree and "only in the primary's: ['FACE']" in differs.detail
    assert not compare({"D": face}, {"D": lower}, Comparison("labels", score=0.7)).agree
    assert kind_of({"D": face}) == "moderation"


def test_tensors_agree_within_tolerance_and_report_the_largest_difference() -> None:
    def answer(*data: float) -> dict[str, object]:
        return {"outputs": [{"name": "Y", "datatype": "FP32", "shape": [len(data)],
                             "data": list(data)}]}
    close = compare(answer(1.0, 2.0), answer(1.0, 2.0000001), Comparison())
    assert close.agree and close.kind == "tensors" and 0 < close.max_abs < 1e-6
    far = compare(answer(1.0, 2.0), answer(1.0, 2.5), Comparison())
    assert not far.agree and far.max_abs == 0.5 and far.max_rel == 0.2
    assert not compare(answer(1.0), answer(1.0, 2.0), Comparison()).agree


def test_plain_json_is_equal_with_numbers_within_tolerance() -> None:
    how = Comparison("equal", atol=0.01)
    assert compare({"a": [1, 2.0]}, {"a": [1, 2.005]}, how).agree
    assert compare({"a": True}, {"a": False}, how).detail == "$.a: 'True' vs 'False'"
    assert "keys" in compare({"a": 1}, {"b": 1}, how).detail
    with pytest.raises(BadRequestError):
        Comparison.from_json({"kind": "fuzzy"})


def test_the_cascade_conditions() -> None:
    cascades = parse_cascades(orjson.dumps({
        "a": {"review_model": "big"}, "b": {"review_model": "big", "when": "unsafe"},
        "c": {"review_model": "big", "when": "label_above:0.5"},
        "d": {"review_model": "big", "when": "labels:X,Y"}}).decode())
    answer = {"D": {"detections": [{"label": "X", "score": 0.4}], "unsafe": True}}
    assert [wants_review(cascades[m], answer) for m in "abcd"] == [True, True, False, True]
    assert not wants_review(cascades["b"], {"D": {"unsafe": False}})
    for bad in ('{"a": {}}', '{"a": {"review_model": "a"}}',
                '{"a": {"review_model": "b", "when": "sometimes"}}',
                '{"a": {"review_model": "b", "when": "label_above:2"}}'):
        with pytest.raises(ConfigError):
            parse_cascades(bad)


def test_a_review_entry_is_found_by_its_exact_bytes() -> None:
    entry = pending_review("t" * 32, "big", "2")
    record = orjson.dumps({"task_id": "x", "review": entry, "status": "SUCCESS"})
    assert b'"review":' + orjson.dumps(entry) in record


def test_comparison_reports_agreement_and_label_shares() -> None:
    report = comparison_report({"compared": "4", "agreed": "3", "answers:primary": "4",
                                "label:primary:FACE": "2", "unsafe:shadow": "1",
                                "answers:shadow": "4", "skipped:expired": "1"}, [], 2)
    assert report["agreement"] == 0.75 and report["skipped"] == {"expired": 1}
    assert report["labels_primary"]["share"] == {"FACE": 0.5}
    assert report["labels_shadow"]["unsafe"] == 1 and report["waiting"] == 2
    assert Pair.parse(Pair("a", "b", "3").member) == Pair("a", "b", "3")


def test_the_admin_api_is_off_without_a_token_and_needs_it_otherwise() -> None:
    off = AdminToken("")
    with pytest.raises(ForbiddenError):
        off.check("Bearer anything")
    on = AdminToken("a" * 24)
    for wrong in (None, "Bearer " + "b" * 24, "Basic " + "a" * 24):
        with pytest.raises(UnauthorizedError):
            on.check(wrong)
    on.check("Bearer " + "a" * 24)


def test_the_sticky_key_is_the_rollout_key_then_the_client() -> None:
    both, client_only = Sticky("client-a", "user-7"), Sticky("client-a")
    assert (both.key("client"), client_only.key("client")) == ("user-7", "client-a")
    assert (both.key("key"), client_only.key("key")) == ("user-7", "")
    assert both.key("none") == ""


class CountingStore:
    """Stands in for the rollouts' store: counts reads, fails when told to."""

    def __init__(self, rollouts: dict[str, Rollout]) -> None:
        self.rollouts, self.reads, self.down = rollouts, 0, False

    async def all(self) -> dict[str, Rollout]:
        self.reads += 1
        if self.down:
            raise RedisConnectionError("Redis is down")
        return dict(self.rollouts)


async def test_the_gateway_reads_the_rollouts_at_most_once_a_refresh() -> None:
    now = [0.0]
    store = CountingStore({"m": CANARY})
    versions = Versions(store, refresh_s=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    picks = [await versions.pick("m", "", Sticky(f"c{i}")) for i in range(50)]
    assert store.reads == 1 and {p.version for p, _ in picks} == {"1", "2"}
    assert (await versions.pick("m", "7", Sticky()))[0] == Pick("7", "pinned")
    assert (await versions.pick("other", "", Sticky("c")))[0] == Pick("", "policy")
    now[0], store.down = 1.5, True
    assert (await versions.pick("m", "", Sticky("c1")))[0].version in {"1", "2"}  # stale copy
    assert store.reads == 2
    await versions.pick("m", "", Sticky("c1"))
    assert store.reads == 2  # a failed read waits its refresh too


def test_the_rollout_command_shows_times_as_people_read_them() -> None:
    assert when(1795739551.0, now=1795739551.0 + 125) == "2026-11-27 00:32:31Z (2 min ago)"
    assert when(1795739551.0, now=1795739551.0 + 7) == "2026-11-27 00:32:31Z (7 s ago)"
    assert when(0) == "never"
    doc = {"rollout": CANARY.to_json(), "figures": {}, "guard": {
        "at": 1795739551.0, "action": "hold", "reason": "why"}, "decisions": [
        {"at": 1795739551.0, "by": "guard", "action": "step", "reason": "held"}]}
    shown = render("status", doc)
    assert "1795739551" not in shown and "2026-11-27 00:32:31Z" in shown
    assert "share set 1970-01-01 00:16:40Z" in shown  # the CANARY's made-up clock


# -- declared steps, kept fields, and `ferry rollout set` ------------------------------------------

@pytest.mark.parametrize(("steps", "wrong"), [
    ([50, 25], "steps must rise, each above the one before: 50, 25 do not"),
    ([5, 5, 100], "steps must rise"),
    ([25, 50], "the last step must be 100 (reaching it promotes the candidate), not 50"),
    ([5, 150], "at most 100"),
    ([], "one or more percentages"),
])
def test_declared_steps_rise_as_given_and_end_at_100(steps: list[float], wrong: str) -> None:
    with pytest.raises(BadRequestError) as info:
        declared("m", {"stable": "1", "candidate": "2", "steps": steps}, 0.0)
    assert wrong in info.value.message
    assert declared("m", {"stable": "1", "steps": [10, 60, 100]}, 0.0).steps == (10, 60, 100)


def test_a_stored_rollout_is_read_whatever_steps_it_was_given_before() -> None:
    """Steps stored before they were judged (sorted, no 100) still load: the guard promotes
    past the last one, and the gateway must keep serving the rollout."""
    stored = Rollout.from_json({"stable": "1", "candidate": "2", "steps": [25, 50]}, "m")
    assert stored.steps == (25, 50) and dataclasses.replace(stored, share=50).next_share() == 100


def test_a_change_keeps_every_field_it_does_not_send() -> None:
    before = dataclasses.replace(
        declared("m", {"stable": "1", "candidate": "2", "share": 25, "shadow": 10,
                       "auto": False, "hold_s": 5}, now=1000.0), generation=3)
    after = amended(before, {"steps": [25, 50, 100]}, 2000.0, "m")
    assert (after.shadow, after.share, after.auto, after.hold_s) == (10, 25, False, 5)
    assert (after.steps, after.state, after.since) == ((25, 50, 100), "canary", 1000.0)
    rolled_back = before.rolled_back(1500.0)
    quieter = amended(rolled_back, {"shadow": 0}, 2000.0, "m")
    assert (quieter.state, quieter.shadow) == ("rolled_back", 0)  # no new trial from a shadow
    anew = amended(rolled_back, {"share": 5}, 2000.0, "m")
    assert (anew.state, anew.since, anew.shadow, anew.share) == ("canary", 2000.0, 10, 5)
    first = amended(None, {"stable": "1"}, 2000.0, "m")
    assert first == declared("m", {"stable": "1"}, 2000.0)
    with pytest.raises(BadRequestError, match="the last step must be 100"):
        amended(before, {"steps": [5, 50]}, 2000.0, "m")


def test_kept_steps_are_not_judged_again_by_a_change_that_does_not_send_steps() -> None:
    stored = Rollout.from_json({"stable": "1", "candidate": "2", "steps": [25, 50]}, "m")
    assert amended(stored, {"shadow": 5}, 1.0, "m").steps == (25, 50)


def set_args(*argv: str) -> argparse.Namespace:
    return build_parser(["rollout", "set", "m", *argv]).parse_args(["rollout", "set", "m", *argv])


@pytest.mark.parametrize(("steps", "wrong"), [
    ("5,abc", "'abc' is not a number"),
    ("50,25", "steps must rise"),
    ("25,50", "the last step must be 100 (reaching it promotes the candidate)"),
    ("5,,100", "an empty entry"),
    ("5,50,100,", "an empty entry"),
    ("0,100", "above 0"),
    ("nan,100", "above 0"),
])
def test_set_refuses_steps_naming_why_without_a_traceback(
    steps: str, wrong: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        set_args("--stable", "1", "--candidate", "2", "--share", "5", "--steps", steps)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "ferry rollout set: error: argument --steps: " in err and wrong in err, err
    assert "Traceback" not in err


def test_set_sends_only_the_options_given() -> None:
    assert declaration(set_args("--steps", " 5, 50 ,100")) == {"steps": [5.0, 50.0, 100.0]}
    assert declaration(set_args("--stable", "1", "--candidate", "2", "--share", "5",
                                "--manual")) == {"stable": "1", "candidate": "2",
                                                 "share": 5.0, "auto": False}
    assert declaration(set_args("--auto", "--compare", '{"kind": "equal"}')) == {
        "auto": True, "compare": {"kind": "equal"}}
    assert declaration(set_args()) == {}


def test_set_with_nothing_to_change_says_so_before_calling_the_gateway() -> None:
    out = io.StringIO()
    assert client_run(set_args("--url", "http://127.0.0.1:9"), out) == 2
    assert "nothing to change" in out.getvalue()


def test_set_shows_the_steps_stored_when_they_are_not_the_defaults() -> None:
    stepped = declared("m", {"stable": "1", "candidate": "2", "share": 5, "shadow": 10,
                             "steps": [5, 50, 100]}, 0.0)
    assert render("set", stepped.to_json()) == ("m: canary, stable 1, candidate 2 at 5%, "
                                                "shadow 10%, steps 5/50/100%, generation 0\n")
    assert "steps" not in render("set", CANARY.to_json())
