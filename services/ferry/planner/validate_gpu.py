"""The planner against the GPU kit's runs (loadtest/gpukit/results/*.json, docs/gpu-kit.md).

For each run and instance count: t(B) is the run's own ``ferry plan fit``; Ferry's processes are
the run's (its gateway processes and batchers, one Redis), each on a core of its own (16 cores:
no shared-core slowdown), with their CPU per task and per batch fitted over the run's Ferry
measurements; Ferry's own latency besides its CPU is calibrated at the lowest measured rate, as
for the bench's configurations. The batchers share the instances as the run's Ferry did: each
with its own window of them before the shared budget (``SHARED_SINCE``), after it through the
budget, riders on or off and the batches per instance as the run's settings say. Then every
measured Ferry rate is predicted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from ferry.planner import arrivals, verdict
from ferry.planner.costs import CostModel
from ferry.planner.cpu import CpuCost, CpuSample, fit
from ferry.planner.deployment import Deployment, Outcome
from ferry.planner.simulate import simulate
from ferry.planner.verdict import unsaturated

SECONDS = 10.0  # simulated seconds per rate (thousands of tasks a second)
PROCESS_OF = {"gateway": "gateway", "batcher": "batchers", "redis": "redis"}  # the kit's names
SHARED_SINCE = datetime.fromisoformat("2026-11-28T10:34:29+00:00")  # the fleet's shared
# budget (6d52be8): runs before it gave each batcher its own window of the instances
OFF = ("", "0", "false", "no", "off")  # a boolean setting's false values (ferry.settings)


@dataclass(frozen=True)
class Point:
    """One of a run's Ferry measurements that completed."""

    instances: int
    offered: float
    achieved: float
    p50_s: float
    p99_s: float
    cpu: CpuSample | None


def points(result: Mapping[str, Any]) -> dict[int, list[Point]]:
    """The run's Ferry measurements without errors, by instance count, by rate."""
    found: dict[int, list[Point]] = {}
    probes = [*result.get("probes", []), *result.get("warm_up", [])]
    for probe in probes:
        measured = probe["measured"]
        if probe["system"] != "ferry" or measured["errors"]:
            continue
        instances = int(probe["model"].rpartition("_x")[2]) if "_x" in probe["model"] else 1
        found.setdefault(instances, []).append(Point(
            instances, probe["rate"], measured["throughput"], measured["p50_ms"] / 1e3,
            measured["p99_ms"] / 1e3, _cpu(probe)))
    for group in found.values():
        group.sort(key=lambda p: p.offered)
    return found


def _cpu(probe: Mapping[str, Any]) -> CpuSample | None:
    spent, inferences = probe.get("cpu_s", {}), probe.get("inferences", 0)
    if not inferences or not all(name in spent for name in PROCESS_OF.values()):
        return None
    return CpuSample(max(1.0, float(probe.get("mean_batch", 1.0))),
                     {process: spent[name] / inferences for process, name in PROCESS_OF.items()})


def ferry_of(result: Mapping[str, Any]) -> Deployment:
    """The run's Ferry, on one instance: its batchers and gateway processes, batches of up to
    64 and 50 ms, and how its batchers shared the instances (``SHARED_SINCE``, and the run's
    ``--setting``s: FERRY_INFLIGHT_BUDGET, FERRY_BUDGET_RIDERS, FERRY_BATCHES_PER_INSTANCE)."""
    sizing = result.get("sizing", {})
    settings = {name: value for name, _, value in (
        str(setting).partition("=") for setting in result.get("options", {}).get("settings") or [])}
    shared = (datetime.fromisoformat(result["started"]) >= SHARED_SINCE
              and settings.get("FERRY_INFLIGHT_BUDGET", "auto") != "local")
    return Deployment(instances=1, max_batch=64, max_wait_s=0.05,
                      batchers=int(sizing.get("batchers", 1)),
                      gateways=int(sizing.get("gateways", 1)), shared_budget=shared,
                      riders=settings.get("FERRY_BUDGET_RIDERS", "true").lower() not in OFF,
                      batches_per_instance=int(settings.get("FERRY_BATCHES_PER_INSTANCE", "1")))


def sharing(ferry: Deployment) -> str:
    """How the run's batchers shared the instances, in words."""
    if not ferry.shares_budget:
        return "each batcher with its own window of the instances"
    return (f"sharing the budget, riders {'on' if ferry.riders else 'off'}, "
            f"{ferry.batches_per_instance} batch{'es' if ferry.batches_per_instance > 1 else ''}"
            " per instance")


def predict(cost: CostModel, ferry: Deployment, point: Point, *, overhead_s: float,
            cpu: CpuCost | None) -> Outcome:
    """The run's Ferry (``ferry_of``) at ``point``."""
    deployment = replace(ferry, instances=point.instances, overhead_s=overhead_s, cpu=cpu)
    return simulate(cost, deployment, arrivals.poisson(point.offered, SECONDS, 0), seed=0)


def run_section(result: Mapping[str, Any], source: str) -> tuple[list[str], int, int]:
    """One run's tables, and (rates within the goal, rates the goal applies to)."""
    fitted = result["fit"]
    cost = CostModel(fitted["t_fixed_ms"] / 1e3, fitted["t_per_ms"] / 1e3)
    sizing, card = result.get("sizing", {}), (result["machine"].get("cards") or ["?"])[0]
    ferry = ferry_of(result)
    lines = ["", f"### {card.split(' (UUID')[0]}, {result['started'][:16].replace('T', ' ')} "
             f"UTC ({source}): t(B) = {fitted['t_fixed_ms']:.2f} + {fitted['t_per_ms']:.3f}·B ms, "
             f"{sizing.get('gateways')} gateway processes, {sizing.get('batchers')} batchers"
             + (f", {sharing(ferry)}" if ferry.batchers > 1 else "")]
    within = counted = 0
    for instances, group in sorted(points(result).items()):
        samples = [p.cpu for p in unsaturated(group) if p.cpu is not None]
        cpu = fit(samples) if samples else None
        bare = predict(cost, ferry, group[0], overhead_s=0.0, cpu=cpu)
        overhead = max(0.0, group[0].p50_s - bare.p50_s)
        table, good, rows = verdict.table(
            group, partial(predict, cost, ferry, overhead_s=overhead, cpu=cpu))
        lines += ["", f"{instances} instance{'s' if instances > 1 else ''}: Ferry's own latency "
                  f"besides its CPU, calibrated at {group[0].offered:,.0f}/s: "
                  f"{overhead * 1e3:.1f} ms.", "", *table]
        within, counted = within + good, counted + rows
    return lines, within, counted


def section(paths: Sequence[Path]) -> list[str]:
    """PLANNER.md's section on the GPU kit's runs (none without runs)."""
    if not paths:
        return []
    body: list[str] = []
    within = counted = 0
    for path in paths:
        lines, good, rows = run_section(json.loads(path.read_text()), path.name)
        body += lines
        within, counted = within + good, counted + rows
    return ["", "## On a GPU (the GPU kit's runs)", "",
            "The planner for the runs of `scripts/gpu-kit.sh run` (BENCHMARKS.md, \"On a GPU\"): "
            "t(B) from each run's `ferry plan fit`, Ferry's processes as the run sized them, "
            "each on a core of its own, with the CPU per task fitted over the run's own Ferry "
            "measurements, the batchers sharing the instances as the run's Ferry did (each "
            "with its own window of them before the shared budget; after it, through the "
            "budget, with riders and the batches per instance as the run's settings say: the "
            "simulation's riders keep a slot with its batcher while it has work, which those "
            "runs, on 2026-11-28, predate); "
            f"{SECONDS:g} simulated seconds per rate. Every Ferry measurement of "
            "the run that completed is predicted (the fixed loads and the goodput searches).",
            "", f"**Within 20%: {within} of {counted} rates below saturation.**", *body]
