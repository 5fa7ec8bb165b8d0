"""The planner against measurements: its predicted p50/p99 for the configurations ``make bench``
ran (the sim backends, 1 and 2 instances, every rate), next to what BENCHMARKS.md measured, and
the design scenario next to the back-of-envelope count. Writes PLANNER.md (``make plan-check``).

Ferry's own latency (gateway, Redis, wake-ups: the overhead the simulation adds to every task) is
calibrated once per configuration, at its lowest measured rate (measured p50 minus the simulated
p50 without overhead), and then held fixed for every other rate: those are the predictions.
"""

from __future__ import annotations

import argparse
import io
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from ferry.cli import main as ferry
from ferry.errors import ConfigError
from ferry.planner import arrivals, validate_gpu, verdict
from ferry.planner.costs import CostModel
from ferry.planner.cpu import BENCH_CPU, PROCESSES, CpuCost, CpuSample, fit
from ferry.planner.deployment import Deployment, Outcome
from ferry.planner.simulate import simulate
from ferry.planner.verdict import SATURATED, unsaturated

SECTION = re.compile(r"^## (\w+) backend, t\(B\) = ([0-9.]+) \+ ([0-9.]+)·B ms, (\d+) instances?")
FLOW = "Ferry, 1 request (Prefer: wait)"
BENCH_CORES = 2  # make bench's machine: Ferry, Triton and the load generator on two cores
BENCH_GATEWAY_WORKERS = 2  # make bench's gateway: a worker per core
CPU_CELL = re.compile(r"^(\d+) \((\d+) \+ (\d+) \+ (\d+)\)")
DESIGN_SCENARIO = ("ferry", "plan", "size", "--qps", "10000", "--p99-ms", "500", "--t-fixed-ms",
                   "40", "--t-per-ms", "2.5")  # as docs/cli.md runs it


@dataclass(frozen=True)
class Measured:
    backend: str
    cost: CostModel
    instances: int
    offered: float
    achieved: float
    p50_s: float
    p99_s: float
    batch: float = 1.0  # the mean batch Triton saw
    generator_s: float = 0.0  # the load generator's CPU per task (on the same cores)
    cpu: CpuSample | None = None  # Ferry's CPU per task, by process

    @property
    def slowdown(self) -> float:
        """How much longer work took than its CPU time on make bench's shared cores: M/M/c's
        response time over its service time, 1 / (1 - U^c) for c = 2 cores, with U what
        Ferry and the generator used of them at this rate (Triton's own share is not
        measured), at most 0.9."""
        ferry = sum(self.cpu.seconds.values()) if self.cpu is not None else 0.0
        busy = min(0.9, self.offered * (ferry + self.generator_s) / BENCH_CORES)
        return 1.0 / (1.0 - busy ** BENCH_CORES)



def measured_rows(text: str, flow: str = FLOW) -> Iterator[Measured]:
    """The Ferry rows of every backend section of BENCHMARKS.md."""
    section: tuple[str, CostModel, int] | None = None
    for line in text.splitlines():
        found = SECTION.match(line)
        if found:
            section = (found[1], CostModel(float(found[2]) / 1e3, float(found[3]) / 1e3),
                       int(found[4]))
            continue
        if section is None or not line.startswith(f"| {flow} |"):
            continue
        cells = [c.strip().replace(",", "") for c in line.strip("|").split("|")]
        batch = float(cells[8]) if len(cells) > 8 and cells[8] else 1.0
        yield Measured(section[0], section[1], section[2], float(cells[1]), float(cells[2]),
                       float(cells[3]) / 1e3, float(cells[5]) / 1e3, batch=batch,
                       cpu=_cpu(cells[10], batch) if len(cells) > 10 else None,
                       generator_s=_leading(cells[11]) / 1e6 if len(cells) > 11 else 0.0)


def _leading(cell: str) -> float:
    """The number a cell starts with ("98 (generator-bound)": 98), 0 for none."""
    found = re.match(r"^[0-9.]+", cell)
    return float(found[0]) if found else 0.0


def _cpu(cell: str, batch: float) -> CpuSample | None:
    """"1167 (500 + 467 + 200)": gateway, batcher and Redis µs per task."""
    found = CPU_CELL.match(cell)
    if found is None:
        return None
    return CpuSample(batch, {process: float(found[i + 2]) / 1e6
                             for i, process in enumerate(PROCESSES)})


def cpu_of(rows: list[Measured]) -> CpuCost | None:
    """Ferry's CPU costs fitted over a configuration's rates below saturation."""
    samples = [row.cpu for row in unsaturated(rows) if row.cpu is not None]
    return fit(samples) if samples else None


def predict(row: Measured, overhead_s: float, seconds: float, seed: int,
            cpu: CpuCost | None = None) -> Outcome:
    """Ferry as make bench runs it: one batcher, batches of up to 64, 50 ms, adaptive flush,
    as many batches in flight as instances; one gateway (a worker per core) and one Redis,
    with ``cpu`` their costs."""
    deployment = Deployment(instances=row.instances, max_batch=64, max_wait_s=0.05,
                            overhead_s=overhead_s, cpu=cpu, gateways=BENCH_GATEWAY_WORKERS,
                            slowdown=row.slowdown if cpu is not None else 1.0)
    return simulate(row.cost, deployment, arrivals.poisson(row.offered, seconds, seed),
                    seed=seed)


def fast_cpu(text: str) -> CpuCost | None:
    """Ferry's CPU costs over every fast-backend rate below saturation (what ``BENCH_CPU``,
    the planner's default, should hold)."""
    samples = []
    for group in _groups(list(measured_rows(text))).values():
        if group[0].backend == "fast":
            samples += [row.cpu for row in unsaturated(group) if row.cpu is not None]
    return fit(samples) if samples else None


def _groups(rows: list[Measured]) -> dict[tuple[str, int], list[Measured]]:
    groups: dict[tuple[str, int], list[Measured]] = {}
    for row in rows:
        groups.setdefault((row.backend, row.instances), []).append(row)
    for group in groups.values():
        group.sort(key=lambda r: r.offered)
    return groups


def cpu_line(cpu: CpuCost) -> str:
    """"gateway 267 + 670/B µs, ...": each process's CPU per task at mean batch B."""
    costs = cpu.to_json()
    return ", ".join(f"{p} {costs[p + '_task_us']:.0f} + {costs[p + '_batch_us']:.0f}/B µs"
                     for p in PROCESSES)


def validation(text: str, seconds: float = 60.0, seed: int = 0) -> tuple[list[str], int, int]:
    """Markdown lines of the table, and (rows within the goal, rows the goal applies to)."""
    lines: list[str] = []
    within = counted = 0
    for group in _groups(list(measured_rows(text))).values():
        section, good, rows = _section(group, seconds, seed)
        lines += section
        within, counted = within + good, counted + rows
    return lines, within, counted


def _section(group: list[Measured], seconds: float, seed: int) -> tuple[list[str], int, int]:
    """One configuration's table: Ferry's CPU fitted over its rates, its own latency calibrated
    at the lowest, then every rate predicted."""
    first, cpu = group[0], cpu_of(group)
    cost = first.cost
    overhead = max(0.0, first.p50_s - predict(first, 0.0, seconds, seed, cpu).p50_s)
    fitted = f" Ferry's CPU per task, fitted: {cpu_line(cpu)}." if cpu is not None else ""
    lines = ["", f"### {first.backend} backend, t(B) = {cost.fixed_s * 1e3:g} + "
             f"{cost.per_item_s * 1e3:g}·B ms, {first.instances} instance"
             f"{'s' if first.instances > 1 else ''}",
             "", f"Ferry's own latency besides its CPU, calibrated at {first.offered:g}/s: "
             f"{overhead * 1e3:.1f} ms.{fitted}", ""]
    table, within, below = verdict.table(
        group, lambda row: predict(row, overhead, seconds, seed, cpu))
    return [*lines, *table], within, below


def design_scenario(seed: int = 0) -> str:
    """What ``ferry plan size`` prints for the design scenario (10,000/s, p99 < 500 ms, a batch
    of 64 in 200 ms, taken as 40 + 2.5·B ms), word for word: docs/cli.md shows it too."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = ferry([*DESIGN_SCENARIO[1:], "--seed", str(seed)])
    if code:
        raise ConfigError(f"{' '.join(DESIGN_SCENARIO)} failed ({code}): see above")
    return out.getvalue().rstrip("\n")


def _intro(bench: str, within: int, counted: int, took: float) -> list[str]:
    return [
        "# The planner against measurements",
        "",
        "Generated by `make plan-check` (`python -m ferry.planner.validate`) from the measured",
        f"figures in {bench}: for every configuration `make bench` ran, the planner's",
        "predicted p50 and p99 (a simulated minute of Poisson arrivals through Ferry's own",
        "batching policy, one batcher, batches of up to 64, 50 ms, adaptive flush) next to the",
        "measured ones (Ferry, 1-request flow). The goal: p99 within 20% below saturation",
        f"(rates below the first one where less than {SATURATED:.0%} of the offered load was",
        "achieved).",
        "",
        f"**Within 20%: {within} of {counted} rates below saturation.** "
        f"(Simulation time for this page: {took:.0f} s.)",
        "",
    ]


def report(bench: Path, seconds: float, seed: int, gpu_runs: Sequence[Path] = ()) -> str:
    started = time.monotonic()
    text = bench.read_text()
    lines, within, counted = validation(text, seconds, seed)
    scenario, fast = design_scenario(seed), fast_cpu(text)
    took = time.monotonic() - started
    return "\n".join([
        *_intro(bench.name, within, counted, took),
        "Ferry's processes are servers in the simulation (`ferry.planner.cpu`): a gateway worker",
        "per core (two), one batcher and one Redis, each doing one thing at a time, with the CPU",
        "per task and per batch fitted over each configuration's measured rates (CPU per",
        "inference against the mean batch). What it leaves out: the load generator and Triton",
        "on the same two cores, which slow every process near saturation, and the time a woken",
        "process waits for a core; the 1-instance fast backend, whose batcher works between",
        "every two calls, shows it most.",
        "",
        "The fit over every fast-backend rate below saturation of this BENCHMARKS.md:",
        f"{cpu_line(fast) if fast else 'none'}. `ferry plan size` assumes `BENCH_CPU` unless",
        f"given `--cpu-costs` ({cpu_line(BENCH_CPU)}: the same fit over an earlier run; this",
        "machine's own cost per request drifts by up to two times between runs).",
        *lines,
        "",
        "## The design scenario",
        "",
        "10,000 requests/s with p99 < 500 ms, a batch of 64 taking 200 ms (t(B) = 40 + 2.5·B ms):",
        f"`{' '.join(DESIGN_SCENARIO)}` (Ferry's",
        "processes with `BENCH_CPU`'s costs, 1.5 ms of latency besides):",
        "",
        "```",
        scenario,
        "```",
        *validate_gpu.section(gpu_runs),
        "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--out", type=Path, default=Path("PLANNER.md"))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-runs", type=Path, nargs="*", default=[],
                        help="the GPU kit's runs (gpu-kit.json files) to predict too")
    args = parser.parse_args()
    args.out.write_text(report(args.bench, args.seconds, args.seed, args.gpu_runs))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
