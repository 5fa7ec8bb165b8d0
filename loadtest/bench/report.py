"""BENCHMARKS.md and its two figures, from the points of one run."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from loadtest.bench.backends import MAX_BATCH, Scenario
from loadtest.bench.floor import REDIS_FLOOR, exchange_name
from loadtest.bench.profile import Hotspot
from loadtest.bench.sweep import (
    FERRY_PROCESSES,
    FERRY_SYSTEMS,
    PEER_SYSTEMS,
    SYSTEMS,
    Point,
    at,
    by,
    ceiling,
    runs_at,
)

ANCHOR = "triton-dyn0"  # Triton alone with its default dynamic batcher
LABELS = {"ferry-1req": "Ferry, 1 request (Prefer: wait)", "ferry-2req": "Ferry, POST + GET",
          "triton-dyn0": "Triton alone, dynamic batching (delay 0)",
          "triton-dyn50": "Triton alone, dynamic batching (delay 50 ms)",
          "triton-unbatched": "Triton alone, no batching",
          "ray-serve": "Ray Serve (@serve.batch)", "bentoml": "BentoML (adaptive batching)",
          "litserve": "LitServe (batching)"}
STYLE = {"ferry-1req": ("tab:blue", "o-"), "ferry-2req": ("tab:cyan", "s-"),
         "triton-dyn0": ("tab:red", "^-"), "triton-dyn50": ("tab:orange", "v--"),
         "triton-unbatched": ("tab:gray", "x:"), "ray-serve": ("tab:purple", "D-."),
         "bentoml": ("tab:green", "P-."), "litserve": ("tab:brown", "*-.")}
DRAWN = SYSTEMS + PEER_SYSTEMS


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    met: bool | None  # None: could not be measured in this run


@dataclass
class Report:
    points: list[Point]
    scenarios: list[Scenario]
    header: list[str]
    max_wait_ms: float
    floors: dict[str, float] = field(default_factory=dict)
    profile: dict[str, list[Hotspot]] = field(default_factory=dict)
    profile_note: str = ""
    goodput: list[str] = field(default_factory=list)  # the goodput section, rendered
    peers: list[str] = field(default_factory=list)  # the peers' section, rendered

    # -- targets ---------------------------------------------------------------------------------

    def targets(self) -> list[Target]:
        fast = next((s for s in self.scenarios if s.backend.label == "fast"
                     and s.instances == 1), None)
        slow = [s for s in self.scenarios if s.backend.label == "slow"]
        found: list[Target] = []
        if fast is not None:
            found += [self._cpu(fast), self._throughput(fast), self._light(fast),
                      self._moderate(fast)]
        found += [self._batching(s) for s in slow]
        return found

    def _cpu(self, s: Scenario) -> Target:
        shown, best = [], math.inf
        for system in FERRY_SYSTEMS:
            runs = runs_at(self.points, s.name, system, 400.0)
            if not runs:
                continue
            median = statistics.median(p.ferry_cpu_us for p in runs)
            parts = {name: statistics.median(p.cpu_us.get(name, 0.0) for p in runs)
                     for name in FERRY_PROCESSES}
            best = min(best, median)
            shown.append(f"{LABELS[system]}: {median:,.0f} µs ("
                         + " + ".join(f"{v:,.0f}" for v in parts.values())
                         + f"){_spread([p.ferry_cpu_us for p in runs], 'µs')}")
        return Target("1. CPU per inference at 400/s", "≤ 300 µs (gateway + batcher + Redis)",
                      "; ".join(shown) or "not measured", best <= 300 if shown else None)

    def _throughput(self, s: Scenario) -> Target:
        goal_rps = min(2000.0, 0.95 * s.backend.batched_capacity(s.instances))
        best = {system: ceiling(self.points, s.name, system) for system in FERRY_SYSTEMS}
        shown = "; ".join(f"{LABELS[k]}: {v:,.0f}/s" for k, v in best.items())
        return Target("2. Throughput with p99 < 100 ms", f"≥ {goal_rps:,.0f} inferences/s",
                      shown, max(best.values()) >= goal_rps)

    def _light(self, s: Scenario) -> Target:
        anchors = runs_at(self.points, s.name, ANCHOR, 50.0)
        if not anchors:
            return Target("3. Light load (50/s)", "", "not measured", None)
        anchor_p99 = statistics.median(p.pct("p99_ms") for p in anchors)
        t1 = s.backend.t_ms(1)
        rows, met = [], True
        for system in FERRY_SYSTEMS:
            runs = runs_at(self.points, s.name, system, 50.0)
            if not runs:
                return Target("3. Light load (50/s)", "", "not measured", None)
            p50 = statistics.median(p.pct("p50_ms") for p in runs)
            p99 = statistics.median(p.pct("p99_ms") for p in runs)
            met = met and p50 <= t1 + 5 and p99 <= anchor_p99 + 10
            rows.append(f"{LABELS[system]}: p50 {p50:.1f}"
                        f"{_spread([p.pct('p50_ms') for p in runs], 'ms')}, p99 {p99:.1f} ms")
        goal = (f"p50 ≤ t(1) + 5 = {t1 + 5:.2f} ms; p99 ≤ Triton alone's "
                f"{anchor_p99:.1f} + 10 ms (medians of {len(anchors)} runs)")
        return Target("3. Light load (50/s)", goal, "; ".join(rows), met)

    def _moderate(self, s: Scenario) -> Target:
        worst: list[str] = []
        met = True
        for system in FERRY_SYSTEMS:
            limit = 0.8 * ceiling(self.points, s.name, system)
            for p in by(self.points, s.name, system):
                anchor = at(self.points, s.name, ANCHOR, p.offered_rps)
                if p.offered_rps > limit or anchor is None or anchor.generator_bound:
                    continue
                d50 = p.pct("p50_ms") - anchor.pct("p50_ms")
                d99 = p.pct("p99_ms") - anchor.pct("p99_ms")
                if d50 > 5 or d99 > 20:
                    met = False
                    worst.append(f"{LABELS[system]} at {p.offered_rps:,.0f}/s: "
                                 f"p50 {d50:+.1f}, p99 {d99:+.1f} ms")
        return Target("4. Moderate load (≤ 80% of Ferry's ceiling)",
                      "p99 ≤ Triton alone + 20 ms, p50 ≤ + 5 ms, at every rate",
                      "; ".join(worst) or "met at every rate measured on both sides", met)

    def _batching(self, s: Scenario) -> Target:
        rate = round(0.8 * s.backend.batched_capacity(s.instances))
        bound = 2 * s.backend.t_ms(MAX_BATCH) + self.max_wait_ms
        rows, met = [], True
        for system in FERRY_SYSTEMS:
            p = at(self.points, s.name, system, float(rate))
            if p is None:
                return Target(f"5. Batching under load ({s.name})", "", "not measured", None)
            ok = p.achieved >= 0.98 * rate and p.pct("p99_ms") <= bound
            met = met and ok
            rows.append(f"{LABELS[system]}: {p.achieved:,.0f}/s, p99 {p.pct('p99_ms'):,.0f} ms, "
                        f"mean batch {p.mean_batch:.1f}")
        return Target(f"5. Batching under load ({s.title}, {rate}/s = 80% of capacity)",
                      f"achieved ≥ 98%, p99 ≤ 2·t(64) + max wait = {bound:,.0f} ms",
                      "; ".join(rows), met)

    # -- markdown --------------------------------------------------------------------------------

    def markdown(self, figures: Sequence[str]) -> str:
        lines = [*self.header, "", "## Targets", "",
                 "| target | goal | measured | |", "|---|---|---|---|"]
        for t in self.targets():
            verdict = {True: "met", False: "**missed**", None: "not measured"}[t.met]
            lines.append(f"| {t.name} | {t.goal} | {t.measured} | {verdict} |")
        if self.goodput:
            lines += ["", *self.goodput]
        if self.peers:
            lines += ["", *self.peers]
        lines += ["", *self._reading(), "", "## Figures", ""]
        lines += [f"![{Path(f).stem}]({f})" for f in figures]
        for scenario in self.scenarios:
            lines += ["", f"## {scenario.title}", "", *self._table(scenario)]
        lines += ["", *self._floor(), "", *self._profile()]
        return "\n".join(lines) + "\n"

    def _reading(self) -> list[str]:
        """What the figures say, in numbers from this run."""
        lines = ["## Reading the results", ""]
        fast = next((s for s in self.scenarios if s.backend.label == "fast"
                     and s.instances == 1), None)
        if fast is None:
            return []
        served = [p for p in by(self.points, fast.name, "ferry-1req") if not p.saturated()]
        if len(served) >= 2:
            low, high = served[0], served[-1]
            lines.append(
                f"- **CPU per inference is mostly per wake-up, not per request.** Ferry (one "
                f"request per task) spends {low.ferry_cpu_us:,.0f} µs at {low.offered_rps:,.0f}/s "
                f"and {high.ferry_cpu_us:,.0f} µs at {high.offered_rps:,.0f}/s: at low rates "
                "every request wakes each process, at high rates one wake-up serves many. On "
                "this machine waking a process is expensive" + self._floor_clause() + "; a "
                "request to Ferry makes eight hops between processes (client → gateway → Redis → "
                "batcher → Triton → batcher → Redis → gateway → client), Triton alone two.")
        anchors = runs_at(self.points, fast.name, ANCHOR, 50.0)
        ferry = runs_at(self.points, fast.name, "ferry-1req", 50.0)
        if anchors and ferry:
            t1 = fast.backend.t_ms(1)
            alone = statistics.median(p.pct("p50_ms") for p in anchors)
            added = statistics.median(p.pct("p50_ms") for p in ferry) - alone
            lines.append(
                f"- **Light load.** Triton alone answers in {alone:.1f} ms at p50 (median of "
                f"{len(anchors)} runs) for a t(1) of {t1:g} ms: its own gRPC and Python-backend "
                f"path uses {alone - t1:.1f} ms of the 5 ms the target allows. Ferry adds "
                f"{added:.1f} ms to that: its hops above, each a wake-up of another process. On "
                "a GPU with TensorRT, Triton's own part is a fraction of that.")
        bound = [p for p in self.points if p.generator_bound]
        if bound:
            lines.append(
                f"- **Where the generator was the bottleneck** ({len(bound)} points, marked in "
                "the tables): it shares the two cores, and Triton alone is driven over gRPC, "
                "which costs the Python client far more per request than Ferry's HTTP does. "
                "Triton alone's high rates are therefore lower bounds of what it can do.")
        return lines

    def _floor_clause(self) -> str:
        if not self.floors:
            return ""
        http = self.floors.get(exchange_name(400.0))
        redis_cmd = self.floors.get(REDIS_FLOOR)
        if http is None or redis_cmd is None:
            return ""
        return (f": uvicorn alone spends {http:,.0f} µs answering one trivial request and "
                f"redis-server {redis_cmd:,.0f} µs on one command, at 400/s")

    def _table(self, s: Scenario) -> list[str]:
        b = s.backend
        rows = [f"Capacity: {b.batched_capacity(s.instances):,.0f}/s with full batches of "
                f"{MAX_BATCH}, {b.unbatched_capacity(s.instances):,.0f}/s one request at a time.",
                "",
                "| system | offered/s | achieved/s | p50 | p90 | p99 | p99.9 ms | errors | "
                "Triton batch | busy | CPU µs/inf in front of Triton (Ferry: gw + batcher + "
                "Redis; a peer: all its processes) | generator µs |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for system in DRAWN:
            for p in by(self.points, s.name, system):
                cpu = (f"{p.ferry_cpu_us:,.0f} ({p.ferry_split})" if system in FERRY_SYSTEMS
                       else f"{p.serving_cpu_us:,.0f}" if system in PEER_SYSTEMS else "")
                flag = " (generator-bound)" if p.generator_bound else ""
                rows.append(
                    f"| {LABELS[system]} | {p.offered_rps:,.0f} | {p.achieved:,.0f} | "
                    f"{p.pct('p50_ms'):.1f} | {p.pct('p90_ms'):.1f} | {p.pct('p99_ms'):.1f} | "
                    f"{p.pct('p999_ms'):.1f} | {p.errors} | {p.mean_batch:.1f} | "
                    f"{p.busy_fraction:.0%} | {cpu} | {p.generator_us:,.0f}{flag} |")
        return rows

    def _floor(self) -> list[str]:
        if not self.floors:
            return []
        return ["## What this machine charges (measured in the same run)", "",
                "| what | CPU µs each |", "|---|---|",
                *(f"| {name} | {value:,.0f} |" for name, value in self.floors.items())]

    def _profile(self) -> list[str]:
        if not self.profile:
            return [f"## Profile\n\n{self.profile_note or 'not taken in this run'}"]
        lines = ["## Profile of what remains (Ferry, 1 request per task, fast backend, 400/s)",
                 "", self.profile_note, ""]
        for process, spots in self.profile.items():
            lines += [f"**{process}** (share of its CPU samples, by function's own time)", "",
                      "| function | share |", "|---|---|",
                      *(f"| `{h.function}` | {h.share:.1%} |" for h in spots), ""]
        return lines

    # -- figures ---------------------------------------------------------------------------------

    def draw(self, curves: Path, cpu: Path) -> None:
        columns = max(1, math.ceil(len(self.scenarios) / 2))
        fig, axes = plt.subplots(2 if len(self.scenarios) > 1 else 1, columns,
                                 figsize=(6.5 * columns, 9 if len(self.scenarios) > 1 else 4.5),
                                 squeeze=False)
        for ax, scenario in zip(axes.flat, self.scenarios, strict=False):
            for system in DRAWN:
                pts = [p for p in by(self.points, scenario.name, system) if p.achieved > 0]
                if pts:
                    color, style = STYLE[system]
                    ax.plot([p.achieved for p in pts], [p.pct("p99_ms") for p in pts], style,
                            color=color, label=LABELS[system], markersize=4)
            ax.set_yscale("log")
            ax.set_title(scenario.title, fontsize=9)
            ax.set_xlabel("achieved throughput (inferences/s)")
            ax.set_ylabel("p99 latency (ms)")
            ax.grid(True, which="both", alpha=0.3)
        axes.flat[0].legend(fontsize=7)
        fig.suptitle("p99 latency against throughput: Ferry, Triton alone and the Python peers, "
                     "same backend")
        fig.tight_layout()
        fig.savefig(curves, dpi=110)
        plt.close(fig)
        self._draw_cpu(cpu)

    def _draw_cpu(self, path: Path) -> None:
        scenario = self.scenarios[0]
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
        colors = {"gateway": "tab:blue", "batcher": "tab:green", "redis": "tab:red"}
        for ax, system in zip(axes, FERRY_SYSTEMS, strict=True):
            pts = [p for p in by(self.points, scenario.name, system) if p.achieved > 0]
            slots = list(range(len(pts)))
            bottom = [0.0] * len(pts)
            for process in FERRY_PROCESSES:
                values = [p.cpu_us.get(process, 0.0) for p in pts]
                ax.bar(slots, values, bottom=bottom, color=colors[process], label=process)
                bottom = [b + v for b, v in zip(bottom, values, strict=True)]
            ax.plot(slots, [p.generator_us for p in pts], "k.--", label="load generator")
            ax.set_xticks(slots, [f"{p.offered_rps:,.0f}" for p in pts])
            ax.axhline(300, color="gray", linestyle=":", label="target 300 µs")
            ax.set_title(f"{LABELS[system]} — {scenario.title}", fontsize=9)
            ax.set_xlabel("offered rate (requests/s)")
            ax.set_ylabel("CPU µs per inference")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _spread(values: list[float], unit: str) -> str:
    """", median of N runs: min-max" when there were several runs."""
    if len(values) < 2:
        return ""
    return f" [median of {len(values)} runs, {min(values):,.1f} to {max(values):,.1f} {unit}]"
