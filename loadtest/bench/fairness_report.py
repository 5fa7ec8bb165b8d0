"""The fair-share part's records, figure and section of BENCHMARKS.md, from what each run
recorded (``loadtest.bench.fairness`` measures them); no server here."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

HEADING = "## Fair share: a flood and a light client"
FIGURE = "fair-share-light-client.png"


@dataclass
class Client:
    """What one client's requests got. ``accepted``: admitted (202, or 200 with the answer);
    ``answered``: its own input's answer came back (the light client waits for it, the flood
    does not); ``refused``: 429; ``errors``: anything else, by what was seen."""

    name: str
    rate: float
    sent: int = 0
    accepted: int = 0
    answered: int = 0
    refused: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)  # of the answered requests

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile of the answered requests' latencies (None: none answered)."""
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "errors": dict(self.errors)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Client:
        return cls(**{**data, "errors": Counter(data["errors"])})


@dataclass
class Run:
    """One run: the light client, with the flood or alone, on a fresh gateway and batcher."""

    mode: str  # alone, fifo, fair
    label: str
    fair_after: int  # FERRY_FAIR_SHARE_AFTER of the gateway
    seconds: float
    light: Client
    flood: Client | None
    busy: float  # the model's execution time in Triton's statistics / the run's wall time
    ran_per_s: float  # inferences Triton executed per second over the run
    mean_batch: float
    capacity_per_s: float  # the rate the batcher measured (sizes the backlog limit)
    late_sends: int  # sends more than 2 ms behind their schedule (the generator fell behind)
    generator_cpu_s: float
    measured: bool = True  # False: a --quick smoke run

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["light"] = self.light.to_json()
        data["flood"] = self.flood.to_json() if self.flood is not None else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        flood = data["flood"]
        return cls(**{**data, "light": Client.from_json(data["light"]),
                      "flood": Client.from_json(flood) if flood is not None else None})


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _errors(client: Client) -> str:
    if not client.errors:
        return "0"
    return f"{sum(client.errors.values())} (" + ", ".join(
        f"{what}: {n}" for what, n in client.errors.most_common()) + ")"


def row(run: Run) -> str:
    light, flood = run.light, run.flood
    flooded = (f"{flood.sent:,} / {flood.accepted:,} / {flood.refused:,} / {_errors(flood)}"
               if flood is not None else "no flood")
    return (f"| {run.label} | {light.sent} / {light.accepted} / {light.answered} / "
            f"{light.refused} / {_errors(light)} | {_ms(light.percentile(50))} | "
            f"{_ms(light.percentile(99))} | {_ms(max(light.latencies_ms, default=None))} | "
            f"{flooded} | {run.busy:.0%} | {run.ran_per_s:.0f} | {run.mean_batch:.1f} |")


def ratios(runs: list[Run]) -> str:
    """The light client's p99 with the flood against its p99 alone, for each way."""
    by_mode = {r.mode: r.light.percentile(99) for r in runs}
    alone = by_mode.get("alone")
    if not alone:
        return "No ratio: the light client alone had no answered request."
    parts = [f"{label} / alone = {p99 / alone:.1f}" for mode, label in
             (("fair", "fair"), ("fifo", "FIFO")) if (p99 := by_mode.get(mode)) is not None]
    return ("The light client's p99 against its p99 alone: " + "; ".join(parts) + "."
            if parts else "No ratio: no run with the flood had an answered light request.")


def lines(runs: list[Run], note: str, figure: str | None) -> list[str]:
    """The section: the note, the figure, a row per run, the ratios."""
    out = [HEADING, "", note, ""]
    if figure is not None:
        out += [f"![the light client's latency: alone, FIFO, fair share]({figure})", ""]
    out += ["| run | light: sent / accepted / answered / refused / other | light p50 (ms) | "
            "light p99 (ms) | light max (ms) | flood: sent / accepted / refused / other | "
            "backend busy | Triton ran (/s) | mean batch |",
            "|---|---|---|---|---|---|---|---|---|",
            *(row(r) for r in runs), "", ratios(runs)]
    late = [f"{r.label}: {r.late_sends}" for r in runs if r.late_sends]
    if late:
        out += ["", "Sends more than 2 ms behind their schedule (the load generator shares "
                "the two cores): " + ", ".join(late) + "."]
    return out


def draw(runs: list[Run], path: Path) -> None:
    """The light client's latency CDF in each run (answered requests, log scale)."""
    figure, axis = plt.subplots(figsize=(6.4, 4.4))
    for run in runs:
        ordered = sorted(run.light.latencies_ms)
        if not ordered:
            continue
        share = [(i + 1) / len(ordered) for i in range(len(ordered))]
        axis.step(ordered, share, where="post",
                  label=f"{run.label} ({run.light.answered} of {run.light.sent} answered)")
    axis.set_xscale("log")
    axis.set_xlabel("light client's latency (ms, from the scheduled send)")
    axis.set_ylabel("share of its answered requests")
    axis.set_ylim(0, 1.02)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    axis.set_title("A light client beside a flood at twice the backend's capacity")
    figure.savefig(path, dpi=110, bbox_inches="tight")  # the legend below the axes included
    plt.close(figure)
