"""The pool part's records, goals and section of BENCHMARKS.md, from what each run recorded
(``loadtest.bench.pool`` measures them); no server here."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtest.bench.backends import MAX_BATCH, Backend

HEADING = "## A pool of Tritons: servers and batchers"
DONE_GOAL = 0.98  # of the requests sent, answered
P99_GOAL = 1.2  # Ferry's p99 over Triton alone's, at most
SHARE_GOAL = (0.4, 0.6)  # each server's share of Ferry's calls, with two servers
BATCH_GOAL = 0.9  # Ferry's mean batch over Triton alone's, at least
SYSTEMS = {"ferry": "Ferry", "triton": "Triton alone"}


def capacity(backend: Backend, servers: int, instances: int = 1) -> float:
    """Tasks per second the pool serves with every execution full: each instance of each
    server runs ``MAX_BATCH`` items in t(``MAX_BATCH``)."""
    return backend.batched_capacity(servers * instances)


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values (None: none)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Side:
    """One system's run at one rate: what the client saw, and what each server's Triton
    counted for the model that system sends to (calls: executions; inferences: items)."""

    system: str  # "ferry" or "triton"
    sent: int
    answered: int
    within_slo: int  # answered within the SLO
    seconds: float  # of load (the schedule's length)
    p50_ms: float | None
    p99_ms: float | None
    calls: dict[str, int] = field(default_factory=dict)  # server name to executions
    inferences: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)  # outcome to count, not SUCCESS
    late_sends: int = 0
    busy_cores: float | None = None  # the machine's CPU busy during the run, in cores

    @property
    def done(self) -> float:
        """The share of the requests sent that were answered (right)."""
        return self.answered / self.sent if self.sent else 0.0

    @property
    def goodput(self) -> float:
        """Answers within the SLO per second of load."""
        return self.within_slo / self.seconds if self.seconds else 0.0

    @property
    def mean_batch(self) -> float:
        """Inferences per execution over every server (Triton's own counts)."""
        executions = sum(self.calls.values())
        return sum(self.inferences.values()) / executions if executions else 0.0

    def shares(self) -> dict[str, float]:
        """Each server's share of the calls (executions)."""
        total = sum(self.calls.values())
        return {name: n / total if total else 0.0 for name, n in self.calls.items()}

    @classmethod
    def measured(cls, system: str, latencies_ms: Sequence[float], sent: int, seconds: float,
                 slo_ms: float, **counts: Any) -> Side:
        """A side from its answered requests' latencies (ms from each scheduled send)."""
        ordered = sorted(latencies_ms)
        return cls(system, sent, len(ordered), sum(1 for v in ordered if v <= slo_ms), seconds,
                   percentile(ordered, 50), percentile(ordered, 99), **counts)


@dataclass
class Row:
    """One configuration at one rate: Ferry and Triton alone on the same servers."""

    servers: int
    batchers: int
    load: str  # what the rate is: "78%" of the pool's capacity, or "50/s"
    rate: float
    ferry: Side
    triton: Side
    first: str = "ferry"  # which ran first (they alternate)

    @property
    def p99_ratio(self) -> float | None:
        f, t = self.ferry.p99_ms, self.triton.p99_ms
        return f / t if f is not None and t else None

    @property
    def batch_ratio(self) -> float | None:
        t = self.triton.mean_batch
        return self.ferry.mean_batch / t if t else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        return cls(**{**data, "ferry": Side(**data["ferry"]), "triton": Side(**data["triton"])})


# -- the goals -------------------------------------------------------------------------------


def done_held(row: Row) -> bool:
    return row.ferry.done >= DONE_GOAL


def p99_held(row: Row) -> bool:
    return row.p99_ratio is not None and row.p99_ratio <= P99_GOAL


def shares_held(row: Row) -> bool | None:
    """Each server between the bounds (None: one server, no such goal)."""
    if row.servers < 2:
        return None
    low, high = SHARE_GOAL
    shares = row.ferry.shares()
    return len(shares) == row.servers and all(low <= s <= high for s in shares.values())


def batch_held(row: Row) -> bool:
    return row.batch_ratio is not None and row.batch_ratio >= BATCH_GOAL


GOALS: tuple[tuple[str, Callable[[Row], bool | None]], ...] = (
    (f"done ≥ {DONE_GOAL:g}", done_held),
    (f"p99 ratio ≤ {P99_GOAL:g}", p99_held),
    (f"each server's share of the calls {SHARE_GOAL[0]:g}-{SHARE_GOAL[1]:g}", shares_held),
    (f"mean batch ratio ≥ {BATCH_GOAL:g}", batch_held),
)


def goals_line() -> str:
    """The goals, as ratios, for the section's header."""
    return (f"**Goals** (ratios): Ferry answers ≥ {DONE_GOAL:g} of the requests sent; Ferry's "
            f"p99 ≤ {P99_GOAL:g} times Triton alone's; with two servers each takes "
            f"{SHARE_GOAL[0]:g}-{SHARE_GOAL[1]:g} of Ferry's calls; Ferry's mean batch ≥ "
            f"{BATCH_GOAL:g} times Triton alone's.")


def label(row: Row) -> str:
    return (f"{row.servers} server{'s' if row.servers > 1 else ''}, {row.batchers} "
            f"batcher{'s' if row.batchers > 1 else ''}, {row.load}")


def verdicts(rows: Sequence[Row]) -> list[str]:
    """Which goals held, in how many of the rows they apply to, and where they did not."""
    out = []
    for name, held in GOALS:
        judged = [(row, held(row)) for row in rows]
        applied = [(row, ok) for row, ok in judged if ok is not None]
        missed = [label(row) for row, ok in applied if not ok]
        if not applied:
            continue
        text = f"- {name}: held in {len(applied) - len(missed)} of {len(applied)} rows"
        out.append(text + (f"; missed: {'; '.join(missed)}." if missed else " (**all**)."))
    return out


# -- the table ------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _mark(text: str, ok: bool | None) -> str:
    """A figure that misses its goal, in bold."""
    return f"**{text}**" if ok is False else text


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _shares(side: Side) -> str:
    return " / ".join(f"{share:.0%}" for share in side.shares().values()) or "-"


def cells(row: Row) -> list[str]:
    f, t = row.ferry, row.triton
    return [str(row.servers), str(row.batchers), row.load, f"{row.rate:,.0f}",
            _mark(f"{f.done:.1%}", done_held(row)) + f" / {t.done:.1%}",
            f"{f.goodput:,.0f} / {t.goodput:,.0f}",
            f"{_ms(f.p50_ms)} / {_ms(t.p50_ms)}", f"{_ms(f.p99_ms)} / {_ms(t.p99_ms)}",
            _mark(_ratio(row.p99_ratio), p99_held(row)),
            _mark(_shares(f), shares_held(row)), _shares(t),
            f"{f.mean_batch:.1f} / {t.mean_batch:.1f}",
            _mark(_ratio(row.batch_ratio), batch_held(row))]


def table(rows: Sequence[Row]) -> list[str]:
    head = ["servers", "batchers", "load", "offered/s", "done: Ferry / Triton alone",
            "goodput at the SLO (/s): Ferry / Triton alone", "p50 ms: Ferry / Triton alone",
            "p99 ms: Ferry / Triton alone", "p99 ratio", "Ferry's calls per server",
            "Triton alone's calls per server", "mean batch: Ferry / Triton alone",
            "batch ratio"]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cells(row)) + " |" for row in rows)]


def failures(rows: Sequence[Row]) -> list[str]:
    """What the requests not answered saw, by row and system (nothing when all were)."""
    found = []
    for row in rows:
        for side in (row.ferry, row.triton):
            if side.failures:
                seen = ", ".join(f"{what} {n}" for what, n in sorted(side.failures.items()))
                found.append(f"{label(row)}, {SYSTEMS[side.system]}: {seen}")
    return ["", "Requests not answered: " + "; ".join(found) + "."] if found else []


def late(rows: Sequence[Row]) -> list[str]:
    counted = [f"{label(row)}: {row.ferry.late_sends} / {row.triton.late_sends}"
               for row in rows if row.ferry.late_sends or row.triton.late_sends]
    if not counted:
        return []
    return ["", "Sends more than 2 ms behind their schedule, Ferry / Triton alone (the client "
                "shares the two cores): " + "; ".join(counted) + "."]


def busy(rows: Sequence[Row]) -> list[str]:
    """The machine's CPU busy during each side's run (every process: the client, Redis, the
    Tritons and Ferry's), where it was measured."""
    counted = [f"{label(row)}: {row.ferry.busy_cores:.2f} / {row.triton.busy_cores:.2f}"
               for row in rows
               if row.ferry.busy_cores is not None and row.triton.busy_cores is not None]
    if not counted:
        return []
    return ["", f"The machine's CPU busy during each run, in cores of {os.cpu_count()}, Ferry / "
                "Triton alone (every process: the client, Redis, the Tritons and Ferry's "
                "gateway and batchers): " + "; ".join(counted) + "."]


def lines(rows: Sequence[Row], note: str) -> list[str]:
    """The section: the note, the goals, a row per configuration and rate, the verdicts."""
    return [HEADING, "", note, "", goals_line(), "", *table(rows), "", "Goals held:", "",
            *verdicts(rows), *failures(rows), *late(rows), *busy(rows)]


def method(backend: Backend, share: float, light_rate: float, slo_ms: float,
           seconds: tuple[float, float]) -> str:
    """How the section was measured, in words."""
    per_server = capacity(backend, 1)
    return (
        f"Tritons on loopback, each serving the slow simulated backend (t(B) = "
        f"{backend.fixed_ms:g} + {backend.per_item_ms:g}·B ms, one instance, batches of at most "
        f"{MAX_BATCH}) twice: without Triton batching for Ferry, with Triton's dynamic batcher "
        "(queue delay 0) for Triton alone. The pool's **capacity** is servers · "
        f"{MAX_BATCH} / t({MAX_BATCH}) = servers · {MAX_BATCH} / "
        f"{backend.t_ms(MAX_BATCH):g} ms = {per_server:.0f}/s per server (every execution "
        f"full); the load is {share:.0%} of it, then a light {light_rate:g}/s. **Ferry**: one "
        "gateway process (a worker per core) and 1, 2 or 4 batchers (`ferry batcher`, the 16 "
        "partitions split between them) with Ferry's default settings, `FERRY_TRITON_URL` "
        "(and `FERRY_TRITON_HTTP_URL`) naming every server: the model's in-flight budget, "
        "one batch per server, shared by the batchers through Redis. A fresh gateway and "
        "batchers for each configuration, Redis emptied first, a warm-up not counted. "
        "**Triton alone**: the same open-loop client sends each request straight to the "
        "servers in turn (round robin over gRPC), one inference per request. Both at the "
        f"same rate, Poisson arrivals drawn in advance, distinct 2 KB payloads, "
        f"{seconds[0]:g} s of load at {share:.0%} and {seconds[1]:g} s at {light_rate:g}/s, "
        "one after the other (alternating which goes first); Ferry's requests are one "
        "`POST /v1/inference` with `Prefer: wait=10`. Latency from each request's scheduled "
        "send to its checked answer; done: the share of the requests sent answered right; "
        f"goodput at the SLO: answers within {slo_ms:.0f} ms (2·t({MAX_BATCH}) + Ferry's "
        "50 ms max wait, the goodput section's SLO) per second of load. Calls per server and "
        "mean batch: Triton's own statistics on each server (gRPC `ModelStatistics`: "
        "executions, and inferences over executions) of the model each system sends to, over "
        "the run. Raw results: `.bench/pool/pool.json`, logs beside it.")
