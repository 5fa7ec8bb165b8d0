"""Goodput at the SLO: the highest Poisson request rate a system serves with its p99 under the SLO.

For each backend and instance count, perf_analyzer (Triton's C++ load generator) drives Triton
alone (the model with Triton's own dynamic batcher, queue delay 0: Triton's default) and Ferry (its
gateway, in front of the model without Triton batching: Ferry batches), over each protocol, with
the same distinct 2 KB BYTES inputs. A rate is good when perf_analyzer saw no error, the p99 stayed
under the SLO (fast backend 50 ms; slow backend 2·t(64) + Ferry's max wait) and at least
``ACHIEVED`` of the asked rate was served. The search is bounded: it starts at ``START`` of the
backend's batched capacity, halves while bad or doubles (up to the capacity) while good, then
bisects the bracket geometrically until it is narrower than ``RESOLUTION``, at most
``MAX_PROBES`` runs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from loadtest.bench.backends import FAST, MAX_BATCH, Scenario
from loadtest.bench.perf_analyzer import (
    WINDOW_STRETCH,
    WINDOWS,
    Load,
    Measurement,
    Protocol,
    bytes_inputs,
    measure,
)
from loadtest.bench.stack import BenchStack

log = logging.getLogger(__name__)

FAST_SLO_MS = 50.0
ACHIEVED = 0.8  # perf_analyzer's Poisson schedule itself runs a few % short in 3 s windows
START = 0.25  # of the batched capacity: a bad run costs more than a good one
RESOLUTION = 1.2  # the bisection stops once the bad rate is within 20% of the good one
MAX_PROBES = 6


def slo_ms(scenario: Scenario, max_wait_ms: float) -> float:
    """Fast backend: 50 ms; slow backend: two full batches and the max wait, 2·t(64) + wait."""
    if scenario.backend is FAST:
        return FAST_SLO_MS
    return 2 * scenario.backend.t_ms(MAX_BATCH) + max_wait_ms


def good(m: Measurement, slo: float) -> bool:
    return m.ok and m.p99_ms <= slo and m.throughput >= ACHIEVED * m.rate


@dataclass
class Bracket:
    """The search's state, pure: the highest rate found good and the lowest found bad."""

    start: float
    ceiling: float
    floor: float = 1.0
    resolution: float = RESOLUTION
    good: float = 0.0
    bad: float = math.inf
    probes: int = 0

    def record(self, rate: float, ok: bool) -> None:
        self.probes += 1
        if ok:
            self.good = max(self.good, rate)
        else:
            self.bad = min(self.bad, rate)

    def next_rate(self) -> float | None:
        """The next rate to try, or None when the search is done."""
        if not self.probes:
            return self.start
        if not self.good:  # nothing good yet: halve
            lower = float(round(self.bad / 2))
            return lower if lower >= self.floor else None
        if math.isinf(self.bad):  # everything good so far: double, up to the ceiling
            return min(2 * self.good, self.ceiling) if self.good < self.ceiling else None
        if self.bad / self.good <= self.resolution:
            return None
        middle = float(round(math.sqrt(self.good * self.bad)))
        return middle if self.good < middle < self.bad else None


@dataclass
class Goodput:
    """One system's goodput at the SLO for one scenario and protocol."""

    scenario: str
    system: str  # "triton" (alone) or "ferry"
    protocol: str
    slo_ms: float
    ceiling: float
    rate: float = 0.0  # the highest good rate (0: none was good)
    at: Measurement | None = None  # what perf_analyzer measured there
    probes: list[Measurement] = field(default_factory=list)
    variant: str = ""  # "slo": a run of the told-the-SLO comparison (its own table)

    @property
    def capped(self) -> bool:
        """The search reached the backend's capacity still good: goodput is at least that."""
        return self.rate >= self.ceiling

    @property
    def errors(self) -> list[str]:
        return list(dict.fromkeys(e for p in self.probes for e in p.errors))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def search(probe: Callable[[float], Awaitable[Measurement]], result: Goodput,
                 max_probes: int = MAX_PROBES, start: float = START) -> Goodput:
    """Fill ``result`` with the highest good rate ``probe`` finds in at most ``max_probes``
    (fewer when two runs in a row fail with errors: lower rates will not mend those)."""
    bracket = Bracket(start=float(round(start * result.ceiling)), ceiling=result.ceiling)
    while bracket.probes < max_probes and (rate := bracket.next_rate()) is not None:
        if len(result.probes) >= 2 and not any(p.ok for p in result.probes[-2:]):
            break
        measured = await probe(rate)
        result.probes.append(measured)
        ok = good(measured, result.slo_ms)
        bracket.record(rate, ok)
        if ok and rate >= result.rate:
            result.rate, result.at = rate, measured
    return result


# -- the bench's part: every scenario, both systems, each protocol --------------------------------

PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http")
SYSTEMS = ("triton", "ferry")
SLO_SYSTEM, SLO_VARIANT, LADDER_VARIANT = "ferry-slo", "slo", "ladder"
LADDER = (0.45, 0.50, 0.55, 0.60, 0.65)  # shares of the capacity run at the tight SLO
LABELS = {"triton": "Triton alone", "ferry": "Ferry", SLO_SYSTEM: "Ferry told the SLO"}
TIGHT_SLO_MS = 200.0  # slow backend: where greedy batching must keep its batches small
PAYLOAD_BYTES = 2048  # as the sweep's generator sends
SAMPLES = 500  # requests a run aims to measure, within its window limits


def interval_ms(rate: float, quick: bool) -> int:
    """perf_analyzer's window: about ``SAMPLES`` requests in its three windows, 1-2 s each."""
    if quick:
        return 500
    wanted = SAMPLES / (WINDOWS * WINDOW_STRETCH * rate) * 1000
    return int(min(2000, max(1000, wanted)))


def inputs_needed(rate: float, interval: int) -> int:
    """Distinct inputs for one run, with room to spare: the windows, start-up and a margin."""
    seconds = WINDOWS * WINDOW_STRETCH * interval / 1000 + 2.0
    return math.ceil(rate * seconds * 1.2) + 100


@dataclass
class GoodputBench:
    """The goodput searches of one bench run, against its stack."""

    stack: BenchStack
    workdir: Path
    max_wait_ms: float
    quick: bool = False
    results: list[Goodput] = field(default_factory=list)
    runs: int = 0

    def targets(self, protocol: Protocol) -> dict[str, str]:
        """host:port of each system for ``protocol``."""
        if protocol == "grpc":
            return {"triton": self.stack.triton_grpc, "ferry": self.stack.gateway_grpc}
        return {"triton": self.stack.triton_http, "ferry": self.stack.gateway_http}

    async def scenario(self, scenario: Scenario) -> None:
        for protocol in PROTOCOLS:
            for system, url in self.targets(protocol).items():
                await self._search(scenario, system, protocol=protocol, url=url,
                                   slo=slo_ms(scenario, self.max_wait_ms))

    async def pinned(self, scenario: Scenario) -> None:
        """Fast backend, one instance, gRPC, with Ferry's processes (gateway, batcher, Redis)
        on the first core and Triton and the load on the second: the policy's share of a gap
        told from the CPU's (Triton alone searched again with the same split)."""
        if scenario.backend is not FAST or scenario.instances != 1 or len(CORES) < 2:
            return
        ferry_core, rest = {CORES[0]}, {CORES[1]}
        ferry_pids = [pid for name in ("gateway", "batcher", "redis")
                      for pid in self.stack.pids.get(name, [])]
        # Triton, and perf_analyzer, which inherits this process's cores when started from here
        rest_pids = [*self.stack.pids.get("triton", []), os.getpid()]
        try:
            pin(ferry_pids, ferry_core)
            pin(rest_pids, rest)
            for system, url in self.targets("grpc").items():
                await self._search(scenario, system, protocol="grpc", url=url,
                                   slo=slo_ms(scenario, self.max_wait_ms),
                                   variant=PINNED_VARIANT)
        finally:
            pin([*ferry_pids, *rest_pids], set(CORES))

    async def told_the_slo(self, scenario: Scenario) -> None:
        """Slow backend, several instances, over gRPC: Ferry with ``FERRY_SLO_MS`` set to the
        SLO, at the table's SLO and at a tight one (where Triton alone and plain Ferry are
        searched again). One instance is left out: the SLO policy never holds a lone instance."""
        if scenario.backend is FAST or scenario.instances < 2:
            return
        table, url = slo_ms(scenario, self.max_wait_ms), self.stack.gateway_grpc
        for slo in (table, TIGHT_SLO_MS):
            for system in ("triton", "ferry") if slo != table else ():
                await self._search(scenario, system, protocol="grpc",
                                   url=self.targets("grpc")[system], slo=slo,
                                   variant=SLO_VARIANT)
                if slo != table:
                    await self._ladder(scenario, system, self.targets("grpc")[system], slo)
            self.stack.restart_batcher(slo_ms=slo)
            try:
                await self._search(scenario, SLO_SYSTEM, protocol="grpc", url=url, slo=slo,
                                   variant=SLO_VARIANT)
                if slo != table:
                    await self._ladder(scenario, SLO_SYSTEM, url, slo)
            finally:
                self.stack.restart_batcher(slo_ms=0.0)

    async def _ladder(self, scenario: Scenario, system: str, url: str, slo: float) -> None:
        """The same fixed rates for every system (``LADDER`` shares of the capacity): a
        finer comparison than the searches' 20% brackets."""
        ceiling = scenario.backend.batched_capacity(scenario.instances)
        result = Goodput(scenario.name, system, "grpc", slo, round(ceiling),
                         variant=LADDER_VARIANT)
        model = _model(scenario, system)
        for share in LADDER[:1] if self.quick else LADDER:
            result.probes.append(await self.probe(model, system, "grpc", url,
                                                  float(round(share * ceiling))))
        self.results.append(result)

    async def _search(self, scenario: Scenario, system: str, *, protocol: Protocol, url: str,
                      slo: float, variant: str = "") -> None:
        result = Goodput(scenario.name, system, protocol, slo, variant=variant,
                         ceiling=round(scenario.backend.batched_capacity(scenario.instances)))
        model = _model(scenario, system)
        await search(partial(self.probe, model, system, protocol, url), result,
                     max_probes=2 if self.quick else MAX_PROBES)
        self.results.append(result)
        log.info("goodput %-8s %-9s %-4s %8.0f/s  (p99 %s, SLO %.0f ms, %d runs)%s",
                 scenario.name, system, protocol, result.rate,
                 _ms(result.at) or "none: no rate tried met the SLO", result.slo_ms,
                 len(result.probes), f"  {result.errors[0]}" if result.errors else "")

    async def probe(self, model: str, system: str, protocol: Protocol, url: str,
                    rate: float) -> Measurement:
        """One perf_analyzer run, with inputs no earlier run sent (Ferry's cache stays out)."""
        self.runs += 1
        interval = interval_ms(rate, self.quick)
        data = bytes_inputs(self.workdir / "inputs.json", "INPUT", inputs_needed(rate, interval),
                            size=PAYLOAD_BYTES, tag=f"run{self.runs:05d}-")
        measured = await measure(Load(url, model, rate, protocol, input_data=data,
                                      interval_ms=interval), self.workdir)
        if system != "triton" and not self.stack.wait_idle():
            log.warning("Ferry still had work queued 60 s after a perf_analyzer run")
        return measured


# -- the report's section --------------------------------------------------------------------------

HEADING = "## Goodput at the SLO (perf_analyzer)"
READING = "## Reading the results"  # report.py's section that follows this one
METHOD = (
    "perf_analyzer 2.41 (Triton's C++ load generator: one sending thread, asynchronous calls, "
    "Poisson arrivals, distinct 2 KB BYTES inputs so Ferry's cache and collapsing never answer) "
    "drives Triton alone (the model with Triton's dynamic batcher, delay 0, at Triton's own "
    "port) and Ferry (its gateway, in front of the same model without Triton batching: Ferry "
    "batches) over the same protocol. Ferry's REST infer holds the call open until its task "
    "ends, so its latency is end to end, as Triton's is. Goodput is the highest rate found whose "
    "run had no error, a p99 under the SLO and at least 80% of the asked rate served. The search "
    "starts at a quarter of the backend's batched capacity, halves or doubles (up to the "
    "capacity), then bisects until the bracket is within 20%, at most 6 runs of three 1-2 s "
    "windows each: each figure is a lower bound within about 20% of the true goodput, and ≥ "
    "marks a system still good at the backend's capacity. perf_analyzer's latency runs from a "
    "request's actual send (its one thread sends some requests of a burst a little late). Its "
    "HTTP client adds to the tail about as much again as the server takes: against a stand-in "
    "server that answers every infer exactly 30 ms after it arrives, it reports p50 33 and p99 "
    "67-69 ms at 400-800/s (a keep-alive Python client: p99 33 ms; at 10 ms, p99 22-28 ms). So "
    "over HTTP a 50 ms SLO penalizes the system whose own latency is longer (Ferry's, on the "
    "fast backend); the gRPC rows are the comparison to trust.")


CORES = sorted(os.sched_getaffinity(0))
PINNED_VARIANT = "pinned"  # Ferry on one core, Triton and the load on the other


def pin(pids: Sequence[int], cores: set[int]) -> None:
    """Every thread of each process onto ``cores`` (threads made later inherit it from their
    maker); a process gone meanwhile is skipped."""
    for pid in pids:
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for thread in threads:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(thread, cores)


def pinned_table(results: list[Goodput]) -> list[str]:
    """The pinned searches beside each other (nothing when the run made none)."""
    pair = {r.system: r for r in results if r.variant == PINNED_VARIANT}
    if len(pair) < len(SYSTEMS):
        return []
    triton, ferry = pair["triton"], pair["ferry"]
    ratio = f"{ferry.rate / triton.rate:.2f}" if triton.rate and ferry.rate else ""
    return ["", "Pinned (fast backend, 1 instance, gRPC): Ferry's gateway, batcher and Redis "
                "on one core, Triton and perf_analyzer on the other, for each system's search:",
            "", "| SLO (p99) | Triton alone (rate asked) | its p99 | Ferry (rate asked) | its p99 "
                "| Ferry / Triton |", "|---|---|---|---|---|---|",
            f"| {triton.slo_ms:,.0f} ms | {_rate(triton)} | {_ms(triton.at)} | {_rate(ferry)} "
            f"| {_ms(ferry.at)} | {ratio} |"]


def section(results: list[Goodput], scenarios: list[Scenario], note: str) -> list[str]:
    """The report's goodput section: the table, how it was measured, and every run."""
    titles = {s.name: s for s in scenarios}
    lines = [HEADING, "", note, "",
             "| backend | instances | protocol | SLO (p99) | Triton alone (rate asked) | its p99 | "
             "Ferry (rate asked) | its p99 | Ferry / Triton |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in scenarios:
        for protocol in PROTOCOLS:
            pair = {r.system: r for r in results if r.scenario == s.name
                    and r.protocol == protocol and not r.variant}
            if len(pair) < len(SYSTEMS):
                continue
            triton, ferry = pair["triton"], pair["ferry"]
            ratio = f"{ferry.rate / triton.rate:.2f}" if triton.rate and ferry.rate else ""
            lines.append(f"| {s.backend.label} | {s.instances} | {protocol} | "
                         f"{triton.slo_ms:,.0f} ms | {_rate(triton)} | {_ms(triton.at)} | "
                         f"{_rate(ferry)} | {_ms(ferry.at)} | {ratio} |")
    lines += told_the_slo_table(results, scenarios)
    lines += pinned_table(results)
    lines += ["", "Every run (asked rate → achieved, p99; ✓ good, ✗ not):", ""]
    lines += [_runs(r, titles[r.scenario]) for r in results if r.scenario in titles]
    return lines


def _model(scenario: Scenario, system: str) -> str:
    """The model a system is driven on: Triton's own batching (delay 0) for Triton alone, the
    unbatched one behind Ferry (Ferry batches)."""
    return scenario.model("triton-dyn0" if system == "triton" else "ferry-1req")


def told_the_slo_table(results: list[Goodput], scenarios: list[Scenario]) -> list[str]:
    """Ferry with ``FERRY_SLO_MS`` beside Triton alone and plain Ferry, over gRPC, at the
    table's SLO and a tight one (nothing when the run made no such search)."""
    told = [r for r in results if r.system == SLO_SYSTEM and r.variant == SLO_VARIANT]
    if not told:
        return _ladder_table(results)
    lines = ["", f"Told the SLO: Ferry's batcher restarted with `FERRY_SLO_MS` set to the SLO "
             f"(deadline-aware batching, docs/architecture.md), over gRPC, on the slow backend "
             f"with several instances, at the table's SLO and at {TIGHT_SLO_MS:g} ms (where "
             f"Triton alone and plain Ferry were searched again).", "",
             "| backend | instances | SLO (p99) | Triton alone | Ferry | Ferry told the SLO | "
             "its p99 | told / Triton | told / Ferry |", "|---|---|---|---|---|---|---|---|---|"]
    by_name = {s.name: s for s in scenarios}
    for r in told:
        s = by_name.get(r.scenario)
        same = {o.system: o for o in results if o.scenario == r.scenario and o.protocol == "grpc"
                and o.slo_ms == r.slo_ms and o.system != SLO_SYSTEM
                and o.variant != LADDER_VARIANT}
        triton, ferry = same.get("triton"), same.get("ferry")
        if s is None or triton is None or ferry is None:
            continue
        lines.append(f"| {s.backend.label} | {s.instances} | {r.slo_ms:,.0f} ms | "
                     f"{_rate(triton)} | {_rate(ferry)} | {_rate(r)} | {_ms(r.at)} | "
                     f"{_ratio(r, triton)} | {_ratio(r, ferry)} |")
    return lines + _ladder_table(results)


def _ladder_table(results: list[Goodput]) -> list[str]:
    """p99 at the same fixed rates for each system, at the tight SLO."""
    ladders = {r.system: r for r in results if r.variant == LADDER_VARIANT}
    if len(ladders) < len(LABELS):
        return []
    order = [ladders[name] for name in LABELS]
    slo = order[0].slo_ms
    lines = ["", f"The same rates for each system, SLO {slo:,.0f} ms (p99 ms, served/s; ✓ under "
             "the SLO with 80% served):", "",
             "| asked/s | " + " | ".join(LABELS.values()) + " |", "|---|---|---|---|"]
    for index, first in enumerate(order[0].probes):
        cells = []
        for system in order:
            probe = system.probes[index] if index < len(system.probes) else None
            cells.append("" if probe is None or not probe.ok else
                         f"{probe.p99_ms:,.1f} ({probe.throughput:,.0f}/s) "
                         f"{'✓' if good(probe, slo) else '✗'}")
        lines.append(f"| {first.rate:,.0f} | " + " | ".join(cells) + " |")
    return lines


def _ratio(a: Goodput, b: Goodput) -> str:
    return f"{a.rate / b.rate:.2f}" if a.rate and b.rate else ""


def _rate(r: Goodput) -> str:
    if r.probes and not any(p.ok for p in r.probes):
        return "every run failed (below)"
    if not r.rate:
        lowest = min((p.rate for p in r.probes), default=0.0)
        return f"< {lowest:,.0f}/s"
    served = f" ({r.at.throughput:,.0f} served)" if r.at is not None else ""
    return f"{'≥ ' if r.capped else ''}{r.rate:,.0f}/s{served}"


def _ms(m: Measurement | None) -> str:
    return f"{m.p99_ms:,.1f} ms" if m is not None else ""


def _runs(r: Goodput, s: Scenario) -> str:
    kind = {LADDER_VARIANT: ", fixed rates", PINNED_VARIANT: ", pinned"}.get(r.variant, "")
    slo = f" (SLO {r.slo_ms:,.0f} ms{kind})" if r.variant else ""
    head = (f"- {s.backend.label}, {s.instances} inst., {LABELS[r.system]} over {r.protocol}"
            f"{slo}: ")
    runs, said = [], set()
    for p in r.probes:
        if p.ok:
            outcome = f"{p.throughput:,.0f}/s, p99 {p.p99_ms:,.1f} ms"
        else:
            outcome = "the same error" if p.errors[0] in said else f"error: {p.errors[0]}"
            said.add(p.errors[0])
        runs.append(f"{p.rate:,.0f}/s → {outcome} {'✓' if good(p, r.slo_ms) else '✗'}")
    return head + "; ".join(runs)


def replace_section(report: str, lines: list[str], heading: str = HEADING) -> str:
    """``report`` with its section ``heading`` (the goodput section by default) replaced by
    ``lines`` (where a full run puts it, before the reading of the results, when it has none;
    else at the end)."""
    text = report.splitlines()
    if heading not in text:
        if READING not in text:
            return "\n".join([*text, "", *lines]) + "\n"
        at = text.index(READING)
        return "\n".join([*text[:at], *lines, "", *text[at:]]) + "\n"
    start, end = _bounds(text, heading)
    tail = ["", *text[end:]] if end < len(text) else []
    return "\n".join([*text[:start], *lines, *tail]) + "\n"


def section_of(report: str, heading: str) -> list[str]:
    """The lines of ``report``'s section ``heading`` (none when it has none)."""
    text = report.splitlines()
    if heading not in text:
        return []
    start, end = _bounds(text, heading)
    return text[start:end]


def _bounds(text: list[str], heading: str) -> tuple[int, int]:
    """Where the section ``heading`` starts, and where the next ``## `` section does."""
    start = text.index(heading)
    end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
    return start, end
