"""The recovery part's figures and its section of BENCHMARKS.md, from what one fault's run
recorded (``loadtest.bench.recovery`` runs them): pure, so that its reading is tested without
servers."""

from __future__ import annotations

import datetime
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtest.bench.backlog import AROUND_S, HOLD_S, PRE_S, Latency, Series, around, outstanding
from loadtest.bench.backlog import recovery as recovery_of
from loadtest.soak.ledger import Tracked, judge

HEADING = "## Recovery: what each fault costs"
ANSWERED = frozenset({"200", "202"})
BROKEN = frozenset({"ConnectionError", "ConnectionResetError", "BrokenPipeError",
                    "IncompleteReadError"})  # sent, then the connection broke
# A batcher's log line when it takes over the tasks of another whose lease ran out.
TAKEN_OVER = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO "
                        r"ferry\.batcher\.reader: took over (?P<tasks>\d+) task\(s\) of "
                        r"batcher \S+, whose lease ran out", re.MULTILINE)
DETAILS = {"back_after_s": "started again, ready {} s after the fault",
           "paused_s": "paused {} s, then continued",
           "taken_over_tasks": "by lease, batchers took over {} tasks of another (each then "
                               "runs alone at Triton: delivered twice, it is a suspect)",
           "taken_over_after_s": "the first {} s after the fault",
           "live": "though no batcher had died: the outage outlasted the lease, so the first "
                   "batcher to renew after it found the other's lease run out, and took over "
                   "tasks that the other ran too",
           "promoted_after_s": "the sentinels promoted a replica {} s after the kill",
           "old_master_in_sync_after_s": "the old master in sync as its replica {} s after the "
                                         "kill",
           "skipped": "**not injected**: {}"}  # how the report words a fault's details


@dataclass(frozen=True)
class Injected:
    """When a fault hit (the load's clock, and the wall clock that records carry) and what
    happened then (how long a restart or a failover took...)."""

    at_s: float
    wall: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class FaultResult:
    """One fault under load, in figures."""

    fault: str
    what: str
    rate: float
    sent: int
    accepted: int
    gave_up: int  # submissions the client stopped retrying (never accepted)
    lost: int
    wrong: int
    answered_twice: int  # final, then a different final record (a task run again)
    created: int | None  # task records made during the run (None: not counted)
    around: Latency
    before: Latency
    recovery_s: float | None
    parts_s: dict[str, float | None]
    saw: dict[str, int]  # the clients' failed attempts, by what they saw
    broken: int  # requests whose connection broke, retried with the same Idempotency-Key
    found: int  # of those, answered with the task admitted before the break
    details: dict[str, Any]
    measured: bool = True  # False: a --quick smoke run

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FaultResult:
        return cls(**{**data, "around": Latency(**data["around"]),
                      "before": Latency(**data["before"])})


def taken_over(logs: list[str], since: float) -> dict[str, Any]:
    """What batchers' logs say they took over by lease after ``since`` (Unix seconds): how
    many tasks, and how soon the first (nothing: none)."""
    found = [(datetime.datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp(),
              int(m["tasks"])) for text in logs for m in TAKEN_OVER.finditer(text)]
    found = [(at, tasks) for at, tasks in found if at >= since]
    if not found:
        return {}
    return {"taken_over_tasks": sum(tasks for _, tasks in found),
            "taken_over_after_s": round(min(at for at, _ in found) - since, 2)}


def spans(tasks: list[Tracked]) -> list[tuple[float, float | None]]:
    """Each request's send and end: its answer, or the client's last try if it gave up."""
    found: list[tuple[float, float | None]] = []
    for task in tasks:
        end = task.final_seen_s
        if end is None and task.task_id is None and task.attempts:
            end = task.attempts[-1].at_s
        found.append((task.scheduled_s, end))
    return found


def broken_and_found(tasks: list[Tracked], fault_wall: float) -> tuple[int, int]:
    """Requests whose connection broke and were answered after a retry with the same key, and
    how many of those the retry found already admitted (created before the fault)."""
    broken = [t for t in tasks if t.first_final is not None
              and any(a.outcome in BROKEN for a in t.attempts)]
    return len(broken), sum(1 for t in broken if _created(t) < fault_wall)


def _created(task: Tracked) -> float:
    """When the task's record says it was admitted (Unix seconds)."""
    return float((task.first_final or {}).get("created_at", math.inf))


def result_of(tasks: list[Tracked], injected: Injected, depth: Series, *, fault: str,
              what: str, rate: float, gave_up: int, created: int | None,
              measured: bool = True) -> FaultResult:
    """The figures of one fault's run: verdicts, latency, recovery, what the clients saw."""
    verdicts = judge(tasks)
    sent = spans(tasks)
    found = recovery_of(sent, injected.at_s, {"queue depth": depth,
                                              "clients' backlog": outstanding(sent)})
    latency = [(t.scheduled_s, t.latency_s) for t in tasks]
    before = [(at, s) for at, s in latency if 1.0 <= at < injected.at_s - AROUND_S]
    saw = Counter(a.outcome for t in tasks for a in t.attempts if a.outcome not in ANSWERED)
    broken, admitted = broken_and_found(tasks, injected.wall)
    return FaultResult(
        fault, what, rate, len(tasks), verdicts.accepted, gave_up, len(verdicts.lost),
        len(verdicts.wrong), len(verdicts.duplicated), created,
        around(latency, injected.at_s, found.total_s),
        Latency.of([s * 1000 for _, s in before if s is not None]), found.total_s,
        {"answered, every request sent before it": found.earlier_ended_s, **found.backlogs_s},
        dict(saw.most_common()), broken, admitted, injected.details, measured)


# -- the section ------------------------------------------------------------------------------


def method(rate: float, before_s: float, after_s: float) -> str:
    return (
        f"Each fault on a stack of its own kind, under open-loop load of {rate:g}/s (Poisson, "
        "distinct 256-byte inputs) on the slow backend (t(B) = 50 + 2·B ms, 1 instance: 40% "
        f"of its capacity), the fault {before_s:g} s in, the load going on {after_s:g} s more: "
        "two gateway processes and two batchers (`ferry gateway`, `ferry batcher`) with "
        "Ferry's default settings (`FERRY_LEASE_MS` 2000, `FERRY_CLAIM_IDLE_MS` 30000), "
        "Triton, and one Redis with its append-only file (fsync every second, as `ferry up` "
        "runs it), or for the failover a master with two replicas and three sentinels "
        "(`down-after-milliseconds` 2500) and `FERRY_REDIS_MIN_REPLICAS=1`. Each request is "
        "one `POST /v1/inference` with `Prefer: wait=20` and its own Idempotency-Key, sent to "
        "the gateways in turn; one that fails (a broken or refused connection, a 503) is sent "
        "again with the same key to the next gateway (backoff from 50 ms, at most 12 tries in "
        "30 s). Every record is read again at the end: lost = never final, or gone; wrong = "
        "not its input's answer. **Recovery** runs from the fault until every request sent "
        "before it is answered and both backlogs are back to their level before it (the most "
        f"in the {PRE_S:g} s before the fault) and stay there {HOLD_S:g} s: the tasks in "
        "Ferry's streams (sampled every 100 ms) and the requests the clients have sent and "
        "not had answered (retries included). Latency is from each request's scheduled send "
        f"to its answer, for the requests sent from {AROUND_S:g} s before the fault until the "
        "recovery.")


def _seconds(value: float | None) -> str:
    return "not within the run" if value is None else f"{value:.1f}"


def _saw(r: FaultResult) -> str:
    shown = ", ".join(f"{name} {count:,}" for name, count in r.saw.items())
    return shown or "nothing: every first try answered"


def row(r: FaultResult) -> str:
    a = r.around
    created = "" if r.created is None else f" ({r.created:,} tasks created)"
    return (f"| {r.what} | {r.sent:,} | {r.accepted:,}{created} | **{r.lost}** | "
            f"**{r.wrong}** | {_saw(r)} | {a.p50_ms:,.0f} / {a.p99_ms:,.0f} / "
            f"{a.max_ms:,.0f} ({a.count:,}) | {r.before.p99_ms:,.0f} | "
            f"**{_seconds(r.recovery_s)}** | "
            + " / ".join(_seconds(v) for v in r.parts_s.values()) + " |")


def notes(r: FaultResult) -> str:
    """What else the run says: the fault's own timings, the retries after a broken
    connection, tasks answered twice, submissions given up."""
    said = [DETAILS[name].format(value) for name, value in r.details.items()
            if name in DETAILS]
    if r.broken:
        said.append(f"{r.broken:,} requests' connections broke; retried with the same "
                    f"Idempotency-Key at the other gateway, {r.found:,} found the task the "
                    f"broken one had admitted (created before the fault) and "
                    f"{r.broken - r.found:,} were admitted then")
    if r.answered_twice:
        said.append(f"{r.answered_twice} answered twice (the same answer)")
    if r.gave_up:
        said.append(f"{r.gave_up} submissions given up by the client (never accepted)")
    return f"- **{r.what}**: " + ("; ".join(said) or "nothing more") + "."


def lines(results: list[FaultResult], note: str) -> list[str]:
    if results and not all(r.measured for r in results):
        return [HEADING, "", note, "", "| fault | requests | accepted | lost | recovery s |",
                "|---|---|---|---|---|",
                *(f"| {r.what} | {r.sent:,} | {r.accepted:,} | {r.lost} | "
                  f"{_seconds(r.recovery_s)} |" for r in results)]
    names = " / ".join(results[0].parts_s) if results else ""
    return [HEADING, "", note, "",
            "| fault | requests | accepted | lost | wrong | what the clients saw (failed "
            "tries, each retried) | around the fault: p50 / p99 / max ms (requests) | p99 "
            f"before, ms | recovery, s | of which: {names}, s |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *(row(r) for r in results), "", *(notes(r) for r in results)]
