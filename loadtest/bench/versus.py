"""Ferry against its Python peers: Ray Serve, BentoML and LitServe, in front of the same Triton.

Each peer (``loadtest/peers``) runs alone beside the bench's Triton, one scenario at a time, and
is driven by the same open-loop generator at the same rates as Ferry and Triton alone. The
sweep's points give each system's goodput at the SLO (the highest rate it served in full, without
errors, with its p99 under the SLO) and its CPU per inference in front of Triton. The fault row
kills the process that holds the batches (``kill -9``) under load and counts the requests that
never got their answer, and how long until the backlog was back to normal
(``loadtest.bench.backlog``). ``--only kill-row`` runs that row alone, for every system, and
puts it in place in the section.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.bench.backends import SLOW, Scenario, write_repository
from loadtest.bench.backlog import outstanding, recovery
from loadtest.bench.goodput import replace_section, slo_ms
from loadtest.bench.peers import PEERS, Peer, installed, workers
from loadtest.bench.stack import BenchStack
from loadtest.bench.sweep import PEER_GROUP, Point, Sweep, at, by
from loadtest.generator import Trace, run

log = logging.getLogger(__name__)

HEADING = "## Against the Python peers"
LABELS = {"ray-serve": "Ray Serve", "bentoml": "BentoML", "litserve": "LitServe",
          "ferry-1req": "Ferry (1 request)", "ferry-2req": "Ferry (POST + GET)",
          "triton-dyn0": "Triton alone"}
VERSIONS = {"ray-serve": "ray[serve] 2.60.0, `@serve.batch`",
            "bentoml": "bentoml 1.4.40, adaptive batching",
            "litserve": "litserve 0.2.19, `max_batch_size`/`batch_timeout`"}
COMPARED = ("ferry-1req", "ferry-2req", "triton-dyn0", *PEERS)
WARM_UP = 40  # requests at 10/s after a peer starts, not reported: its connections, its loops
FAULT_SCENARIO = Scenario(SLOW, 1)
FAULT_SHARE = 0.4  # of the slow backend's batched capacity
FAULT_SECONDS = 15.0
KILL_AT_S = 5.0
FAULT_DRAIN_S = 60.0  # the longest wait for an answer after the last send (a request a
# killed worker held may never get one)
FAULT_TITLE = "**kill -9 of the serving process under load**"
KILLED_WORKER = "- **A killed worker.**"


@dataclass
class FaultRun:
    """One system under load while the process holding its batches is killed."""

    system: str
    killed: str  # what was killed, in words
    rate: float
    sent: int
    statuses: dict[str, int]
    p99_ms: float
    max_ms: float
    # From the kill until every request sent before it had ended and the requests outstanding
    # at the client were back to their level before it (None: not within the run; or not
    # measured, in a run before this was).
    backlog_s: float | None = None

    @property
    def lost(self) -> int:
        return self.sent - self.statuses.get("SUCCESS", 0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def sweep_peers(sweep: Sweep, scenario: Scenario, rates: list[float], state: Path,
                      *, fault: bool) -> list[FaultRun]:
    """Each peer in turn: started in front of the scenario's model, swept, (killed under load),
    stopped."""
    if not installed():
        log.warning("the peers' venv is missing (make bench installs it): no peers measured")
        return []
    faults: list[FaultRun] = []
    for name in PEERS:
        peer = Peer(name, state, sweep.stack.triton_grpc, scenario.model(name))
        await asyncio.to_thread(peer.start)
        sweep.peer = peer
        try:
            await sweep.warm_up(scenario, name, count=WARM_UP)
            await sweep.system(scenario, name, rates)
            if fault:
                faults.append(await peer_fault(peer, scenario))
        finally:
            sweep.peer = None
            await asyncio.to_thread(peer.stop)
    return faults


async def under_fault(system: str, flow: str, url: str, model: str,
                      kill: Callable[[], Awaitable[str]]) -> FaultRun:
    """Open-loop load for ``FAULT_SECONDS``; ``kill`` runs ``KILL_AT_S`` into it."""
    rate = round(FAULT_SHARE * FAULT_SCENARIO.backend.batched_capacity(1))
    count = int(rate * FAULT_SECONDS)
    trace = Trace()
    load = asyncio.create_task(run(flow, url, model, rate, count, seed=4242,
                                   drain_s=FAULT_DRAIN_S, trace=trace))
    await asyncio.sleep(KILL_AT_S)
    kill_at = time.perf_counter()
    killed = await kill()
    result = await load
    kill_s = kill_at - trace.start  # on the run's clock
    back = recovery(trace.spans, kill_s, {"clients": outstanding(trace.spans)}).total_s
    log.info("fault %s: %s; %s; back to normal after %s s", system, killed, result.statuses,
             back)
    return FaultRun(system, killed, rate, count, dict(result.statuses), result.p99_ms,
                    result.max_ms, back)


async def peer_fault(peer: Peer, scenario: Scenario) -> FaultRun:
    async def kill() -> str:
        targets = workers(peer)
        if not targets:
            return "no worker found to kill"
        with contextlib.suppress(ProcessLookupError):
            os.kill(targets[0], signal.SIGKILL)
        return f"kill -9 of 1 of its {len(targets)} worker processes"
    return await under_fault(peer.name, "peer", peer.url, scenario.model(peer.name), kill)


async def ferry_fault(stack: BenchStack, scenario: Scenario) -> FaultRun:
    """kill -9 of Ferry's batcher, started again at once (as a supervisor would)."""
    async def kill() -> str:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stack.pids["batcher"][0], signal.SIGKILL)
        await asyncio.to_thread(stack.restart_batcher)
        return "kill -9 of its batcher (its only one), started again at once"
    run_ = await under_fault("ferry-1req", "ferry-1req", stack.gateway_url,
                             scenario.model("ferry-1req"), kill)
    await asyncio.to_thread(stack.wait_idle)
    return run_


def save(state: Path, faults: list[FaultRun], note: str) -> None:
    """The fault runs and the section's note, beside the sweep's ``results.json``."""
    (state / "faults.json").write_text(json.dumps([f.to_json() for f in faults]))
    (state / "peers-note.txt").write_text(note)


def rewrite(out: Path, state: Path, scenarios: list[Scenario], max_wait_ms: float) -> None:
    """The section again, from a run's raw results (``--only peers-report``): for a reading
    reworded after the run, without measuring again."""
    points = [Point(**p) for p in json.loads((state / "results.json").read_text())]
    faults = [FaultRun(**f) for f in json.loads((state / "faults.json").read_text())]
    lines = section(points, scenarios, faults, max_wait_ms,
                    (state / "peers-note.txt").read_text())
    out.write_text(replace_section(out.read_text(), lines, HEADING))


# -- the section ------------------------------------------------------------------------------


def goodput(points: list[Point], scenario: Scenario, system: str, max_wait_ms: float) -> float:
    """The highest rate of the sweep answered in full, every answer right, p99 within the SLO
    (a bounded p99 is a system that kept up; at least 90% served in the run's middle, whose
    count at 10/s moves by 2% a request, and the generator on schedule)."""
    slo = slo_ms(scenario, max_wait_ms)
    good = [p.offered_rps for p in by(points, scenario.name, system)
            if p.errors == 0 and p.pct("p99_ms") <= slo and p.achieved >= 0.9 * p.offered_rps
            and not p.generator_bound]
    return max(good, default=0.0)


def common_rate(points: list[Point], scenario: Scenario) -> float:
    """The highest rate every compared system served in full: where CPU is compared."""
    served = [{p.offered_rps for p in by(points, scenario.name, s) if not p.saturated()}
              for s in COMPARED if any(by(points, scenario.name, s))]
    both = set.intersection(*served) if served else set()
    return max(both, default=0.0)


def section(points: list[Point], scenarios: list[Scenario], faults: list[FaultRun],
            max_wait_ms: float, note: str) -> list[str]:
    if not any(p.system in PEERS for p in points):
        return [HEADING, "", "Not measured in this run: " + (note or "no peer ran") + "."]
    lines = [HEADING, "", note, "", *method(), "", *goodput_table(points, scenarios, max_wait_ms),
             "", *served_table(points, scenarios), "", *cpu_table(points, scenarios), ""]
    if faults:
        lines += [*fault_table(faults), ""]
    lines += reading(points, scenarios, faults, max_wait_ms)
    return lines


def method() -> list[str]:
    peers = "; ".join(f"{LABELS[p]} ({VERSIONS[p]})" for p in PEERS)
    return [
        f"The peers: {peers}. Each is the service its documentation shows (`loadtest/peers/`): "
        "one JSON request over HTTP, the framework's own batching (at most 64, waiting at most "
        "50 ms), one gRPC call to the same Triton model with the whole batch "
        f"(`tritonclient.grpc.aio`), each request's output back; {os.cpu_count()} serving "
        "processes, as Ferry's gateway has. Each runs alone beside Triton (the others stopped), "
        "driven by the generator that drives Ferry, at the same rates; the tables per backend "
        "below carry their rows, and the operating-curve figure their lines."]


def goodput_table(points: list[Point], scenarios: list[Scenario], max_wait_ms: float
                  ) -> list[str]:
    head = " | ".join(LABELS[s] for s in COMPARED)
    rows = ["**Goodput at the SLO** (requests/s: the highest rate of the sweep at which every "
            "request got its right answer with the p99 within the SLO and at least 90% of the "
            "rate served; the sweep's rate steps are the resolution; Ferry's ratio to each "
            "peer)", "",
            f"| backend | SLO | {head} | Ferry ÷ peer |",
            "|---|---|" + "---|" * len(COMPARED) + "---|"]
    for s in scenarios:
        rates = {system: goodput(points, s, system, max_wait_ms) for system in COMPARED}
        ratios = ", ".join(f"{LABELS[p]} {_ratio(rates['ferry-1req'], rates[p])}"
                           for p in PEERS)
        cells = " | ".join(f"{rates[system]:,.0f}" for system in COMPARED)
        rows.append(f"| {s.name} | {slo_ms(s, max_wait_ms):g} ms | {cells} | {ratios} |")
    return rows


def served(points: list[Point], scenario: Scenario, system: str) -> float:
    """The highest rate of the sweep the system kept up with, whatever its latency."""
    return max((p.offered_rps for p in by(points, scenario.name, system) if not p.saturated()),
               default=0.0)


def served_table(points: list[Point], scenarios: list[Scenario]) -> list[str]:
    head = " | ".join(LABELS[s] for s in COMPARED)
    rows = ["**Highest rate kept up with, whatever the latency** (requests/s: at least 90% served, "
            "at most 1% errors, p99 under 2 s; the sweep's steps)", "",
            f"| backend | {head} |", "|---|" + "---|" * len(COMPARED)]
    for s in scenarios:
        cells = " | ".join(f"{served(points, s, system):,.0f}" for system in COMPARED)
        rows.append(f"| {s.name} | {cells} |")
    return rows


def cpu_table(points: list[Point], scenarios: list[Scenario]) -> list[str]:
    rows = ["**CPU per inference in front of Triton** (µs, at the highest rate every system "
            "served; Ferry: gateway + batcher + Redis; a peer: every process it runs, the "
            "largest named)", "",
            "| backend | rate/s | " + " | ".join(LABELS[s] for s in COMPARED if s != "triton-dyn0")
            + " |", "|---|---|" + "---|" * (len(COMPARED) - 1)]
    for s in scenarios:
        rate = common_rate(points, s)
        cells = [_cpu_cell(at(points, s.name, system, rate)) for system in COMPARED
                 if system != "triton-dyn0"]
        rows.append(f"| {s.name} | {rate:,.0f} | " + " | ".join(cells) + " |")
    return rows


def _cpu_cell(p: Point | None) -> str:
    if p is None:
        return "n/a"
    if p.system not in PEERS:
        return f"{p.serving_cpu_us:,.0f} ({p.ferry_split})"
    parts = sorted(((v, k.split("/", 1)[1]) for k, v in p.cpu_us.items()
                    if k.startswith(PEER_GROUP + "/")), reverse=True)[:3]
    named = ", ".join(f"`{name}` {value:,.0f}" for value, name in parts)
    return f"{p.serving_cpu_us:,.0f} ({named})"


def fault_table(faults: list[FaultRun], note: str = "") -> list[str]:
    s = FAULT_SCENARIO
    rows = [f"{FAULT_TITLE} ({s.name}, open loop at {FAULT_SHARE:.0%} of its capacity, "
            f"{FAULT_SECONDS:g} s, the kill {KILL_AT_S:g} s in; every request waited for up to "
            f"{FAULT_DRAIN_S:g} s after the last send; measured, not asserted; p99 and max: of "
            "the requests answered; back to normal: from the kill until every request sent "
            "before it had ended, answered or not (a lost one when its connection broke), and "
            "the requests outstanding at the client were no more than in the 3 s before it, "
            "for 1 s)" + (f". {note}" if note else ""), "",
            "| system | what was killed | requests | answered | lost | how they ended | "
            "p99 ms | max ms | back to normal, s |", "|---|---|---|---|---|---|---|---|---|"]
    for f in faults:
        ended = ", ".join(f"{k} {v}" for k, v in sorted(f.statuses.items())
                          if k != "SUCCESS" and v)
        back = "not measured" if f.backlog_s is None else f"{f.backlog_s:,.1f}"
        rows.append(f"| {LABELS[f.system]} | {f.killed} | {f.sent:,} | "
                    f"{f.statuses.get('SUCCESS', 0):,} | **{f.lost:,}** | {ended or '-'} | "
                    f"{f.p99_ms:,.0f} | {f.max_ms:,.0f} | {back} |")
    return rows


def replace_faults(report: str, faults: list[FaultRun], note: str) -> str:
    """``report`` with the kill -9 table and its sentence in the reading replaced by these
    runs' (``--only kill-row``); ValueError if it has no such table (a full run writes it)."""
    lines = report.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(FAULT_TITLE)), None)
    if start is None:
        raise ValueError("the report has no kill -9 table: make bench writes it")
    end = next((i for i in range(start + 2, len(lines)) if not lines[i].startswith("|")),
               len(lines))
    lines[start:end] = fault_table(faults, note)
    said = next((i for i, line in enumerate(lines) if line.startswith(KILLED_WORKER)), None)
    if said is not None:
        lines[said] = _fault_sentence(faults)
    return "\n".join(lines) + "\n"


async def kill_row(state: Path, max_wait_ms: float, *, with_peers: bool) -> list[FaultRun]:
    """The kill -9 row alone, on a Triton of its own: Ferry's, then each installed peer's,
    each warmed up as the sweep would have (``--only kill-row``)."""
    scenario = FAULT_SCENARIO
    stack = BenchStack(state, write_repository(state / "models", [scenario], max_wait_ms))
    stack.start(default_model=scenario.model("ferry-1req"))
    try:
        await run("ferry-1req", stack.gateway_url, scenario.model("ferry-1req"), 10.0, WARM_UP)
        faults = [await ferry_fault(stack, scenario)]
        for name in PEERS if with_peers and installed() else ():
            peer = Peer(name, state, stack.triton_grpc, scenario.model(name))
            await asyncio.to_thread(peer.start)
            try:
                await run("peer", peer.url, scenario.model(name), 10.0, WARM_UP)
                faults.append(await peer_fault(peer, scenario))
            finally:
                await asyncio.to_thread(peer.stop)
    finally:
        stack.stop()
    (state / "faults.json").write_text(json.dumps([f.to_json() for f in faults]))
    return faults


def reading(points: list[Point], scenarios: list[Scenario], faults: list[FaultRun],
            max_wait_ms: float) -> list[str]:
    """Where Ferry leads and where it trails, in this run's numbers."""
    lines = ["**Reading.**", ""]
    for peer in PEERS:
        lines.append(f"- **{LABELS[peer]}.** " + _goodput_sentence(points, scenarios, peer,
                                                                 max_wait_ms)
                     + " " + _cpu_sentence(points, scenarios, peer) + " "
                     + _batch_sentence(points, scenarios, peer))
    lines.append(_trails(points, scenarios))
    lines += why(points, scenarios, faults)
    return lines


def _trails(points: list[Point], scenarios: list[Scenario]) -> str:
    """Where a peer did better than Ferry: a higher rate kept up with, or less CPU."""
    found = []
    for s in scenarios:
        rate = common_rate(points, s)
        ferry = at(points, s.name, "ferry-1req", rate)
        for peer in PEERS:
            if served(points, s, peer) > served(points, s, "ferry-1req"):
                found.append(f"{LABELS[peer]} kept up with {served(points, s, peer):,.0f}/s on "
                             f"{s.name}, Ferry with {served(points, s, 'ferry-1req'):,.0f}/s "
                             "(at a p99 over the SLO)")
            other = at(points, s.name, peer, rate)
            if ferry and other and 0 < other.serving_cpu_us < ferry.serving_cpu_us:
                found.append(f"{LABELS[peer]} spent {other.serving_cpu_us:,.0f} µs per inference "
                             f"on {s.name} at {rate:,.0f}/s, Ferry {ferry.serving_cpu_us:,.0f}")
    return ("- **Where Ferry trails.** " + "; ".join(found) + "." if found
            else "- **Where Ferry trails.** Nowhere in this run's goodput, rates or CPU.")


def why(points: list[Point], scenarios: list[Scenario], faults: list[FaultRun]) -> list[str]:
    """Why, in the mechanisms each system has, with this run's figures beside them."""
    lines = ["", "**Why.**", ""]
    fast = next((s for s in scenarios if s.backend is not SLOW), None)
    if fast is not None:
        lowest = [(peer, next(by(points, fast.name, peer), None)) for peer in PEERS]
        p99s = ", ".join(f"{LABELS[peer]} {p.pct('p99_ms'):.0f} ms" for peer, p in lowest if p)
        lines.append(
            "- **The batch window.** Ray Serve's `@serve.batch` waits `batch_wait_timeout_s` "
            "after a batch's first request, and a LitServe worker waits `batch_timeout` from when "
            "it starts collecting, whatever Triton is doing: at light load nearly every request "
            "waits the whole 50 ms, and their p99 cannot be under the fast backend's 50 ms SLO "
            f"(p99 at {fast.name}'s lowest rate: {p99s}). Ferry sends at once when Triton has an "
            "idle instance and nobody else is expected soon (its adaptive flush); BentoML's "
            "adaptive window also shortens its wait when waiting does not pay.")
    lines.append(_split_sentence(points, scenarios))
    lines.append(
        "- **CPU.** Ferry's request makes eight hops between processes (client, gateway, Redis, "
        "batcher, Triton and back) and is written to Redis before it is answered; a peer's "
        "stays in one process's memory but pays for its framework: Ray's control plane (GCS, "
        "raylet, controller, HAProxy, agents) runs whatever the load, BentoML's workers run its "
        "tracing and metrics middleware per request, LitServe passes every request and answer "
        "through a multiprocessing manager. The CPU table names each peer's largest processes.")
    if faults:
        lines.append(_fault_sentence(faults))
    return lines


def _split_sentence(points: list[Point], scenarios: list[Scenario]) -> str:
    """Each peer batches in each of its processes; Ferry has one batcher for the traffic."""
    slow = next((s for s in scenarios if s.backend is SLOW and s.instances == 1), None)
    figures = ""
    if slow is not None:
        low = min((p.offered_rps for p in by(points, slow.name, "ferry-1req")), default=0.0)
        rate = next((p.offered_rps for p in by(points, slow.name, "ferry-1req")
                     if p.offered_rps > low), low)
        batches = [(s, at(points, slow.name, s, rate)) for s in ("ferry-1req", *PEERS)]
        shown = ", ".join(f"{LABELS[s]} {p.mean_batch:.1f} ({p.busy_fraction:.0%} busy)"
                          for s, p in batches if p)
        figures = (f" On {slow.name} (t(B) = 50 + 2·B ms: each call pays 50 ms whatever its "
                   f"size) at {rate:,.0f}/s, Triton's mean batch (and how busy it was): "
                   f"{shown}.")
        first = min(PEERS, key=lambda peer: served(points, slow, peer))
        if first == "ray-serve":
            figures += (" Ray Serve's replicas, each sending its own batches to the one "
                        "instance, fell behind first.")
    return ("- **One batcher, or one per process.** A peer batches inside each serving process, "
            "so its traffic is split into as many queues, each sending its own smaller batches "
            "(Ray Serve's replicas and BentoML's workers; LitServe's workers take from one shared "
            "queue). Ferry's batcher forms batches from all of the traffic." + figures)


def _fault_sentence(faults: list[FaultRun]) -> str:
    ferry = next((f for f in faults if f.system == "ferry-1req"), None)
    others = ", ".join(f"{LABELS[f.system]} {f.lost:,}" for f in faults if f is not ferry)
    late = ""
    if ferry is not None:
        back = ("" if ferry.backlog_s is None else
                f"; the backlog back to normal {ferry.backlog_s:,.1f} s after the kill")
        late = (f"none lost of {ferry.sent:,}; the tasks the killed batcher held waited there "
                "until the batcher started in its place took them over, once the dead one's "
                "lease ran out (`FERRY_LEASE_MS`, 2 s by default; before leases, after "
                "`FERRY_CLAIM_IDLE_MS`, 30 s), and were answered late (max "
                f"{ferry.max_ms / 1000:,.1f} s{back})")
    return ("- **A killed worker.** Ferry keeps an accepted request in Redis until it is "
            f"answered: {late}. A peer holds its requests in the worker's memory, and those in "
            f"flight die with it: lost {others or '(no peer ran)'}. Ray Serve restarts the "
            "replica and reloads "
            "HAProxy (connections closed on the way); BentoML's arbiter restarts the worker on "
            "its 10 s check; LitServe, by default (`restart_workers=False`), begins to shut the "
            "whole server down, serving with the other worker until it is gone about a minute "
            "later.")


def _goodput_sentence(points: list[Point], scenarios: list[Scenario], peer: str,
                      max_wait_ms: float) -> str:
    """Where Ferry's goodput at the SLO is higher than the peer's, lower, the same."""
    kinds: dict[str, list[str]] = {"higher": [], "lower": [], "the same": []}
    for s in scenarios:
        ferry, other = (goodput(points, s, x, max_wait_ms) for x in ("ferry-1req", peer))
        kind = "higher" if ferry > other else "lower" if ferry < other else "the same"
        kinds[kind].append(f"{s.name} ({ferry:,.0f} against {other:,.0f}/s)")
    return "Ferry's goodput at the SLO is " + "; ".join(
        f"{kind} on {', '.join(found)}" for kind, found in kinds.items() if found) + "."


def _cpu_sentence(points: list[Point], scenarios: list[Scenario], peer: str) -> str:
    pairs = []
    for s in scenarios:
        rate = common_rate(points, s)
        ferry, other = at(points, s.name, "ferry-1req", rate), at(points, s.name, peer, rate)
        if ferry and other and other.serving_cpu_us:
            pairs.append(f"{s.name} {ferry.serving_cpu_us / other.serving_cpu_us:.2f}x")
    return ("CPU per inference, Ferry's ÷ its: " + ", ".join(pairs) + "." if pairs else "")


def _batch_sentence(points: list[Point], scenarios: list[Scenario], peer: str) -> str:
    """Triton's mean executed batch for Ferry and the peer at the rate where CPU is compared."""
    pairs = []
    for s in scenarios:
        rate = common_rate(points, s)
        ferry, other = at(points, s.name, "ferry-1req", rate), at(points, s.name, peer, rate)
        if ferry and other:
            pairs.append(f"{s.name} {ferry.mean_batch:.1f} against {other.mean_batch:.1f}")
    return ("Triton's mean batch there, Ferry's against its: " + ", ".join(pairs) + "."
            if pairs else "")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ("∞" if a else "-")

