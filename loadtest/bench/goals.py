"""The goodput targets (Ferry must not cost GPUs), each beside the figure that measured it.

Composed from the raw results the other parts of ``make bench`` leave in its state folder
(``results.json``: the sweep; ``goodput.json``: perf_analyzer's searches; ``keepup/keepup.json``:
the ten fresh stacks), after every run of any part, so that the table always shows the latest
figure of each; a part not run yet reads "not measured".
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench.goodput import HEADING as GOODPUT_HEADING
from loadtest.bench.goodput import replace_section
from loadtest.bench.peers import PEERS
from loadtest.bench.sweep import PEER_GROUP
from loadtest.bench.versus import LABELS as PEER_LABELS

HEADING = "## Goodput targets (Ferry must not cost GPUs)"
GOODPUT_AIM = 1.0  # Ferry's goodput at the SLO over Triton alone's
P99_WITHIN = 1.2  # at 80% of the slow backend's capacity, Ferry's p99 over Triton alone's
BUSY_POINTS = 0.02  # the backend's busy share: Ferry's within 2 points of Triton alone's
CPU_400_US, CPU_50_US = 700.0, 2000.0
# Ferry's goodput over Triton alone's, fast backend, one instance, over gRPC: each issue's aim
GRPC_GOODPUT_AIMS = (("issue 36", 0.6), ("issue 45", 0.8))
# Ferry's CPU per inference over its client's bare exchanges, at each rate: each issue's aims
EXCHANGE_AIMS = (("issue 36", {400.0: 1.5, 1200.0: 1.5}), ("issue 45", {400.0: 5.0, 1200.0: 3.0}))
LIGHT_RATE, LIGHT_P50_MS, LIGHT_P99_MS = 50.0, 2.0, 10.0  # over Triton alone's, at 50/s
PERFORMANCE = "docs/performance.md"
WHY_CPU = ("a write per hop in five processes sharing two cores: each task crosses between "
           "processes about a dozen times, and on this virtual machine a write that wakes "
           "another process is the dearest thing a process does (Redis's two Lua scripts are "
           f"half of its time); measured in {PERFORMANCE}, 'Where a task's CPU goes', and the "
           "profile at the end of this page. Larger batches save at most 18% (50/s) and 12% "
           "(400/s) for 13-23 ms of p50, and fewer processes at most 13% with a worse tail ('What "
           "the cost per task is not'); what it would take is fewer crossings per task: "
           "a compiled front for the hot routes, and a result handed to its waiting call in "
           "memory where one process admitted and batched the task")
WHY_FAST_GOODPUT = ("on the fast backend a call takes 4-20 ms, and Ferry's CPU per task, on the "
                    "two cores that Triton and perf_analyzer use too, sets its ceiling (the CPU "
                    "rows, and what they would take)")
WHY_SLOW = ("Ferry's own latency, 15-35 ms at p99 here, takes part of a budget that Triton alone "
            "keeps whole, and its CPU competes with the load on two cores; the searches' "
            f"brackets are 20% wide and runs of the same code differ by more ({PERFORMANCE})")
WHY_GAP = ("what remains is a slot that frees with less than half of greedy batching's batch "
           "waiting (it waits for company, by the adaptive flush's rule), read-aheads that go "
           "stale when a call runs past its fit, and the batcher waiting for a core (the "
           "ferry.batches log's 'free' lines)")
PRIORITY_TEST = ("tests/integration/test_traffic.py::"
                 "test_a_high_priority_task_rides_the_next_batch_whatever_its_doorbell")


@dataclass(frozen=True)
class Goal:
    target: str
    goal: str
    measured: str
    met: bool | None  # None: not measured here
    command: str
    verdict_text: str = ""  # instead of met / missed / not measured
    why: str = ""  # what a profile says keeps it from its goal, shown when missed

    def row(self) -> str:
        verdict = self.verdict_text or {True: "met", False: "**missed**",
                                        None: "not measured"}[self.met]
        return (f"| {self.target} | {self.goal} | {self.measured} | {verdict} | "
                f"`{self.command}` |")


def _json(path: Path) -> Any:
    """A part's raw results; None when it has not run (or left nothing readable)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _load(path: Path) -> list[dict[str, Any]]:
    data = _json(path)
    return data if isinstance(data, list) else []


def section(state: Path) -> list[str]:
    points = _load(state / "results.json")
    goodput = _load(state / "goodput.json")
    keepup = _load(state / "keepup" / "keepup.json")
    burnt = _load(state / "keepup" / "keepup-burn.json")
    floors = _json(state / "floors.json")
    floors = floors if isinstance(floors, dict) else {}
    goals = [*goodput_goals(goodput), *grpc_goodput_goals(goodput), *told_goals(goodput),
             *slow_load_goals(points), keep_up_goal(keepup), keep_up_goal(burnt, burn=True),
             *cpu_goals(points),
             *exchange_goals(points, floors), peers_goal(points), light_goal(points),
             gap_goal(keepup), priority_goal()]
    measured = [g for g in goals if g.met is not None]
    met = sum(g.met is True for g in measured)
    return [HEADING, "",
            "Issues 17's, 36's and 45's targets, each with the figure that measured it and the "
            "command that measures it again (every figure comes from the latest run of its "
            f"part of `make bench`). **{met} of the {len(measured)} measured here met.**", "",
            "| target | goal | measured | | command |", "|---|---|---|---|---|",
            *(g.row() for g in goals), *reasons(goals)]


def reasons(goals: Sequence[Goal]) -> list[str]:
    """Why the missed targets missed: each reason once, after the targets it covers."""
    covered: dict[str, list[str]] = {}
    for goal in goals:
        if goal.met is False and goal.why:
            covered.setdefault(goal.why, []).append(goal.target)
    if not covered:
        return []
    return ["", "Why the missed ones missed:", "",
            *(f"- {'; '.join(targets)}: {why}." for why, targets in covered.items())]


def write(report: Path, state: Path) -> None:
    """Replace (or add, before the goodput section) the targets' section of ``report``."""
    text = report.read_text() if report.exists() else ""
    lines = text.splitlines()
    if HEADING not in lines and GOODPUT_HEADING in lines:
        at = lines.index(GOODPUT_HEADING)
        text = "\n".join([*lines[:at], HEADING, "", *lines[at:]]) + "\n"
    report.write_text(replace_section(text, section(state), HEADING))


# -- goodput at the SLO (perf_analyzer) -----------------------------------------------------------

def _rate(entry: dict[str, Any]) -> str:
    capped = entry["rate"] >= entry["ceiling"]
    return f"{'≥ ' if capped else ''}{entry['rate']:,.0f}/s"


def goodput_goals(results: Sequence[dict[str, Any]]) -> list[Goal]:
    """Ferry's goodput over Triton alone's, for every scenario (gRPC, the protocol whose client
    does not distort the tail; HTTP beside it)."""
    found = {(r["scenario"], r["system"], r["protocol"]): r for r in results
             if not r.get("variant")}
    goals = []
    for scenario in sorted({r["scenario"] for r in results}):
        parts, ratios = [], {}
        for protocol in ("grpc", "http"):
            ferry, triton = (found.get((scenario, s, protocol)) for s in ("ferry", "triton"))
            if ferry is None or triton is None or not triton["rate"]:
                continue
            ratios[protocol] = _ratio(ferry, triton)
            parts.append(f"{protocol}: {_rate(ferry)} vs {_rate(triton)} "
                         f"({ratios[protocol]:.2f})")
        slo = next((r["slo_ms"] for r in results if r["scenario"] == scenario), 0)
        goals.append(Goal(f"Goodput at the SLO, {scenario.replace('_', ' ')}",
                          f"Ferry / Triton alone ≥ {GOODPUT_AIM:.1f} (p99 ≤ {slo:.0f} ms)",
                          "; ".join(parts) or "not measured",
                          ratios["grpc"] >= GOODPUT_AIM if "grpc" in ratios else None,
                          "python -m loadtest.bench --only goodput",
                          why=WHY_FAST_GOODPUT if scenario.startswith("fast") else WHY_SLOW))
    return goals or [Goal("Goodput at the SLO", f"Ferry / Triton alone ≥ {GOODPUT_AIM:.1f}",
                          "not measured", None, "python -m loadtest.bench --only goodput")]


def grpc_goodput_goals(results: Sequence[dict[str, Any]]) -> list[Goal]:
    """Over gRPC on the fast backend, one instance, Ferry's goodput over Triton alone's, against
    each issue's aim (``GRPC_GOODPUT_AIMS``); with the pinned searches (Ferry on one core,
    Triton and the load on the other) beside it."""
    found = {(r["system"], r.get("variant", "")): r for r in results
             if r["scenario"] == "fast_1i" and r["protocol"] == "grpc"}
    parts, shared = [], None
    for variant, label in (("", "shared cores"), ("pinned", "pinned")):
        ferry, triton = found.get(("ferry", variant)), found.get(("triton", variant))
        if ferry is None or triton is None or not triton["rate"]:
            continue
        ratio = _ratio(ferry, triton)
        parts.append(f"{label}: {_rate(ferry)} vs {_rate(triton)} ({ratio:.2f})")
        if not variant:
            shared = ratio
    return [Goal(f"Goodput at the SLO, fast 1i, gRPC ({issue})", f"Ferry / Triton alone ≥ {aim}",
                 "; ".join(parts) or "not measured", None if shared is None else shared >= aim,
                 "python -m loadtest.bench --only goodput", why=WHY_FAST_GOODPUT)
            for issue, aim in GRPC_GOODPUT_AIMS]


def told_goals(results: Sequence[dict[str, Any]]) -> list[Goal]:
    """Ferry told the SLO (``FERRY_SLO_MS``) against Triton alone, at each SLO it was searched."""
    told = [r for r in results if r["system"] == "ferry-slo" and r.get("variant") == "slo"]
    goals = []
    for ferry in told:
        triton = next((r for r in results if r["system"] == "triton"
                       and r["scenario"] == ferry["scenario"] and r["protocol"] == "grpc"
                       and r["slo_ms"] == ferry["slo_ms"]
                       and r.get("variant") in ("slo", "")), None)
        if triton is None or not triton["rate"]:
            continue
        ratio = _ratio(ferry, triton)
        goals.append(Goal(f"Goodput told the SLO of {ferry['slo_ms']:.0f} ms, "
                          f"{ferry['scenario'].replace('_', ' ')}, gRPC",
                          f"Ferry / Triton alone ≥ {GOODPUT_AIM:.1f}, aim 1.1 (p99 ≤ "
                          f"{ferry['slo_ms']:.0f} ms)",
                          f"{_rate(ferry)} vs {_rate(triton)} ({ratio:.2f})",
                          ratio >= GOODPUT_AIM, "python -m loadtest.bench --only goodput",
                          why=WHY_SLOW))
    return goals


def _ratio(ferry: dict[str, Any], triton: dict[str, Any]) -> float:
    """Both at the backend's capacity still good: even (1.0), whatever the bound's rounding."""
    if ferry["rate"] >= ferry["ceiling"] and triton["rate"] >= triton["ceiling"]:
        return 1.0
    return float(ferry["rate"]) / float(triton["rate"])


# -- the sweep: 80% of the slow backend, CPU per inference -----------------------------------------

def _median_at(points: Sequence[dict[str, Any]], scenario: str, system: str,
               rate: float, key: str) -> float | None:
    values = [_value(p, key) for p in points if p["scenario"] == scenario
              and p["system"] == system and abs(p["offered_rps"] - rate) < 0.5]
    return statistics.median(values) if values else None


def _value(point: dict[str, Any], key: str) -> float:
    if key == "cpu":
        return float(sum(point["cpu_us"].get(p, 0.0) for p in ("gateway", "batcher", "redis")))
    return float(point["busy_fraction"] if key == "busy" else point["run"][key])


def slow_load_goals(points: Sequence[dict[str, Any]]) -> list[Goal]:
    """At the slow backend's 80% rate (the sweep's top rate there), Ferry's p99 within 1.2 times
    Triton alone's, and the backend busy within 2 points of Triton alone's."""
    goals = []
    for scenario in ("slow_1i", "slow_2i"):
        rates = [p["offered_rps"] for p in points if p["scenario"] == scenario]
        if not rates:
            continue
        rate = max(rates)
        found = [_median_at(points, scenario, system, rate, key)
                 for system in ("ferry-2req", "triton-dyn0") for key in ("p99_ms", "busy")]
        if any(value is None for value in found):
            continue
        ferry_p99, ferry_busy, triton_p99, triton_busy = (float(v or 0.0) for v in found)
        ratio, points_apart = ferry_p99 / max(triton_p99, 1e-9), ferry_busy - triton_busy
        goals.append(Goal(
            f"{scenario.replace('_', ' ')} at {rate:,.0f}/s (80% of capacity), POST + GET",
            f"p99 ≤ Triton alone's times {P99_WITHIN}; backend busy within 2 points",
            f"p99 {ferry_p99:.0f} vs {triton_p99:.0f} ms ({ratio:.2f}); busy "
            f"{ferry_busy:.0%} vs {triton_busy:.0%} ({points_apart * 100:+.0f} points)",
            ratio <= P99_WITHIN and abs(points_apart) <= BUSY_POINTS, "make bench", why=WHY_SLOW))
    return goals


def cpu_goals(points: Sequence[dict[str, Any]]) -> list[Goal]:
    """Ferry's CPU per inference (gateway + batcher + Redis) on the fast backend."""
    goals = []
    for rate, limit in ((400.0, CPU_400_US), (50.0, CPU_50_US)):
        two = _median_at(points, "fast_1i", "ferry-2req", rate, "cpu")
        one = _median_at(points, "fast_1i", "ferry-1req", rate, "cpu")
        measured = ", ".join(f"{name}: {value:,.0f} µs" for name, value in
                             (("POST + GET", two), ("1 request", one)) if value is not None)
        goals.append(Goal(f"CPU per inference at {rate:,.0f}/s, fast backend",
                          f"≤ {limit:,.0f} µs (POST + GET)", measured or "not measured",
                          two <= limit if two is not None else None, "make bench", why=WHY_CPU))
    return goals


def exchange_goals(points: Sequence[dict[str, Any]], floors: dict[str, Any]) -> list[Goal]:
    """Ferry's CPU per inference over what its client's exchanges cost a bare uvicorn at the
    same pace (``floor.http_floors``): one exchange a task for the one-request flow, two (each
    at twice the rate) for POST then GET; against each issue's aim at each rate
    (``EXCHANGE_AIMS``)."""
    exchange = {float(rate): float(us) for rate, us in floors.get("exchange", {}).items()}
    measured = {rate: _over_exchanges(points, exchange, rate)
                for rate in {rate for _, aims in EXCHANGE_AIMS for rate in aims}}
    return [Goal(f"CPU per inference against the client's bare exchanges, fast 1i, "
                 f"{rate:,.0f}/s ({issue})", f"≤ {aim} times (both flows)",
                 "; ".join(measured[rate][0]) or "not measured",
                 all(r <= aim for r in measured[rate][1]) if len(measured[rate][1]) == 2
                 else None, "make bench", why=WHY_CPU)
            for issue, aims in EXCHANGE_AIMS for rate, aim in aims.items()]


def _over_exchanges(points: Sequence[dict[str, Any]], exchange: dict[float, float],
                    rate: float) -> tuple[list[str], list[float]]:
    """At ``rate``, each flow's CPU per inference over its bare exchanges: the figures as
    shown, and the ratios (a flow not measured is left out)."""
    parts, ratios = [], []
    for system, label, count in (("ferry-1req", "1 request", 1), ("ferry-2req", "POST + GET", 2)):
        cpu = _median_at(points, "fast_1i", system, rate, "cpu")
        bare = exchange.get(rate * count)
        if cpu is None or bare is None:
            continue
        ratios.append(cpu / (count * bare))
        parts.append(f"{label}: {cpu:,.0f} µs, {ratios[-1]:.1f} times {count} of "
                     f"{bare:,.0f} µs (a bare exchange at {rate * count:,.0f}/s)")
    return parts, ratios


def peers_goal(points: Sequence[dict[str, Any]]) -> Goal:
    """Ferry (one request a task, as the peers are driven) spends less CPU per inference than
    each Python peer at every rate both served on the fast backend."""
    worse, compared = [], 0
    for point in points:
        if point["scenario"] != "fast_1i" or point["system"] not in PEERS:
            continue
        name = PEER_LABELS[point["system"]]
        rate = point["offered_rps"]
        ferry = _median_at(points, "fast_1i", "ferry-1req", rate, "cpu")
        peer = float(point["cpu_us"].get(PEER_GROUP, 0.0))
        if ferry is None or peer <= 0:
            continue
        compared += 1
        if ferry >= peer:
            worse.append(f"{name} at {rate:,.0f}/s ({ferry:,.0f} against {peer:,.0f} µs)")
    measured = (f"more than a peer at {len(worse)} of {compared} points: " + "; ".join(worse)
                if worse else f"less at all {compared} points") if compared else "not measured"
    return Goal("CPU per inference against Ray Serve, BentoML and LitServe, fast 1i",
                "less than each, at every rate both served (1 request a task)", measured,
                not worse if compared else None, "make bench", why=WHY_CPU)


def light_goal(points: Sequence[dict[str, Any]]) -> Goal:
    """At 50/s on the fast backend, Ferry's p50 and p99 close to Triton alone's (the medians
    of the sweep's runs and its repeats)."""
    alone = _light(points, "triton-dyn0")
    parts, met = [], []
    for system, label in (("ferry-1req", "1 request"), ("ferry-2req", "POST + GET")):
        ferry = _light(points, system)
        if ferry is None or alone is None:
            continue
        p50, p99 = ferry[0] - alone[0], ferry[1] - alone[1]
        parts.append(f"{label}: p50 {ferry[0]:.1f} ({p50:+.1f}), p99 {ferry[1]:.1f} "
                     f"({p99:+.1f}) ms")
        met.append(p50 <= LIGHT_P50_MS and p99 <= LIGHT_P99_MS)
    if parts and alone is not None:
        parts.insert(0, f"Triton alone p50 {alone[0]:.1f}, p99 {alone[1]:.1f} ms")
    return Goal(f"Light load ({LIGHT_RATE:,.0f}/s) against Triton alone, fast 1i",
                f"p50 ≤ + {LIGHT_P50_MS:g} ms, p99 ≤ + {LIGHT_P99_MS:g} ms (medians of runs)",
                "; ".join(parts) or "not measured", all(met) if met else None, "make bench",
                why=WHY_CPU)


def _light(points: Sequence[dict[str, Any]], system: str) -> tuple[float, float] | None:
    """A system's median p50 and p99 at the light rate on the fast backend (None: not run)."""
    p50, p99 = (_median_at(points, "fast_1i", system, LIGHT_RATE, key)
                for key in ("p50_ms", "p99_ms"))
    return None if p50 is None or p99 is None else (p50, p99)


# -- keeping up, the dispatch gap, priorities ------------------------------------------------------

def keep_up_goal(records: Sequence[dict[str, Any]], burn: bool = False) -> Goal:
    ratios = [r["ferry"]["p99_ms"] / max(r["triton"]["p99_ms"], 1e-9) for r in records]
    measured = (f"{sum(x <= P99_WITHIN for x in ratios)} of {len(ratios)} runs; p99 ratio "
                f"median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}"
                if ratios else "not measured")
    return Goal("Keeping up at 78% of the slow backend, 2 instances, every run"
                + (", half a core busy beside it" if burn else ""),
                f"p99 ≤ Triton alone's times {P99_WITHIN} in every run", measured,
                all(x <= P99_WITHIN for x in ratios) if ratios else None,
                "python -m loadtest.bench --only keepup", why=WHY_SLOW)


def gap_goal(records: Sequence[dict[str, Any]]) -> Goal:
    gaps = [r["batches"]["gap_p50_ms"] for r in records]
    worst = [r["batches"]["gap_max_ms"] for r in records]
    measured = (f"median of the runs' p50 {statistics.median(gaps):.1f} ms (their p50s "
                f"{min(gaps):.1f}-{max(gaps):.1f}); longest {max(worst):.0f} ms"
                if gaps else "not measured")
    return Goal("Dispatch gap (a call's end, work waiting, to the next batch leaving)",
                "about 1 ms (`ferry_dispatch_gap_seconds`)", measured,
                statistics.median(gaps) <= 1.0 if gaps else None,
                "python -m loadtest.bench --only keepup", why=WHY_GAP)


def priority_goal() -> Goal:
    return Goal("High priority rides the next batch", "no more than one lower-priority batch "
                "finishes between a high-priority task's admission and its own finish",
                "a test against real Redis and Triton (it failed before the fix), in every "
                "`make test`", None, f"make test ({PRIORITY_TEST})",
                verdict_text="tested, not benchmarked")
