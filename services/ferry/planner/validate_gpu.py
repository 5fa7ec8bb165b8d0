"""The planner against the GPU kit's runs (loadtest/gpukit/results/*.json, docs/gpu-kit.md).

For each run and instance count: t(B) is the run's own ``ferry plan fit``; Ferry's processes are
the run's (its gateway processes and batchers, one Redis), each on a core of its own (16 cores:
no shared-core slowdown), with their CPU per task and per batch fitted over the run's Ferry
measurements; Ferry's own latency besides its CPU is calibrated at the lowest measured rate, as
for the bench's configurations. Then every measured Ferry rate is predicted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


def predict(cost: CostModel, sizing: Mapping[str, int], point: Point, *, overhead_s: float,
            cpu: CpuCost | None) -> Outcome:
    """The run's Ferry at ``point``: its batchers each with its own window of the instances, as
    Ferry ran before its batchers shared the budget (every run of the kit so far)."""
    deployment = Deployment(instances=point.instances, max_batch=64, max_wait_s=0.05,
                            batchers=int(sizing.get("batchers", 1)), overhead_s=overhead_s,
                            cpu=cpu, gateways=int(sizing.get("gateways", 1)),
                            shared_budget=False)
    return simulate(cost, deployment, arrivals.poisson(point.offered, SECONDS, 0), seed=0)


def run_section(result: Mapping[str, Any], source: str) -> tuple[list[str], int, int]:
    """One run's tables, and (rates within the goal, rates the goal applies to)."""
    fitted = result["fit"]
    cost = CostModel(fitted["t_fixed_ms"] / 1e3, fitted["t_per_ms"] / 1e3)
    sizing, card = result.get("sizing", {}), (result["machine"].get("cards") or ["?"])[0]
    lines = ["", f"### {card.split(' (UUID')[0]}, {result['started'][:16].replace('T', ' ')} "
             f"UTC ({source}): t(B) = {fitted['t_fixed_ms']:.2f} + {fitted['t_per_ms']:.3f}·B ms, "
             f"{sizing.get('gateways')} gateway processes, {sizing.get('batchers')} batchers"]
    within = counted = 0
    for instances, group in sorted(points(result).items()):
        samples = [p.cpu for p in unsaturated(group) if p.cpu is not None]
        cpu = fit(samples) if samples else None
        bare = predict(cost, sizing, group[0], overhead_s=0.0, cpu=cpu)
        overhead = max(0.0, group[0].p50_s - bare.p50_s)
        table, good, rows = verdict.table(
            group, partial(predict, cost, sizing, overhead_s=overhead, cpu=cpu))
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
            "measurements, each batcher with its own window of the instances (as Ferry ran "
            "then, before its batchers shared the in-flight budget); "
            f"{SECONDS:g} simulated seconds per rate. Every Ferry measurement of "
            "the run that completed is predicted (the fixed loads and the goodput searches).",
            "", f"**Within 20%: {within} of {counted} rates below saturation.**", *body]
