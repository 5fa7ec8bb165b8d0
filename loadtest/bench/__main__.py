"""``make bench``: Ferry against Triton alone on the same backends, on this machine, in one run.

    .venv/bin/python -m loadtest.bench            # the full run: BENCHMARKS.md and docs/*.png
    .venv/bin/python -m loadtest.bench --quick    # a smoke run (seconds), written elsewhere
    .venv/bin/python -m loadtest.bench --only goodput  # perf_analyzer's goodput at the SLO
                                                       # alone: that section of BENCHMARKS.md
    .venv/bin/python -m loadtest.bench --only keepup   # ten fresh stacks at 78%: that section
    .venv/bin/python -m loadtest.bench --only jobs     # bulk jobs: batch sizes, hybrid
    .venv/bin/python -m loadtest.bench --only durability  # the cost of WAIT, of fsync always
    .venv/bin/python -m loadtest.bench --only recovery  # each fault under load, its recovery
    .venv/bin/python -m loadtest.bench --only fairness  # a flood beside a light client
    .venv/bin/python -m loadtest.bench --only pool      # 1-2 Tritons, 1-4 batchers
    .venv/bin/python -m loadtest.bench --only redis-clients  # ferry.resp, redis-py, coredis

Everything is started here (one tritonserver serving every model variant, Redis, Ferry's gateway
and batcher) on loopback ports, and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import uvloop

from loadtest.bench import (
    durability,
    fairness,
    goals,
    jobs,
    keepup,
    peers,
    pool,
    recovery,
    redis_clients,
    versus,
)
from loadtest.bench.backends import FAST, SLOW, Scenario, write_repository
from loadtest.bench.floor import (
    EXCHANGE_RATES,
    REDIS_FLOOR,
    exchange_name,
    http_floors,
    redis_floor,
)
from loadtest.bench.goodput import METHOD as GOODPUT_METHOD
from loadtest.bench.goodput import GoodputBench, replace_section, section, section_of
from loadtest.bench.perf_analyzer import binary as perf_analyzer
from loadtest.bench.profile import hotspots, py_spy, record
from loadtest.bench.report import Report
from loadtest.bench.stack import BenchStack
from loadtest.bench.sweep import SYSTEMS, Sweep, TritonStats
from loadtest.generator import run
from loadtest.gpukit.report import HEADING as GPU_HEADING

log = logging.getLogger("loadtest.bench")
ROOT = Path(__file__).resolve().parents[2]
MAX_WAIT_MS = 50.0
FAST_RATES = [50.0, 200.0, 400.0, 800.0, 1200.0, 1600.0, 2000.0, 2400.0, 3000.0]


def rates(scenario: Scenario, quick: bool) -> list[float]:
    if quick:
        return [50.0, 200.0]
    if scenario.backend is FAST:
        return FAST_RATES
    top = round(0.8 * scenario.backend.batched_capacity(scenario.instances))
    return [r for r in (10.0, 25.0, 50.0, 100.0, 200.0, 400.0) if r < top] + [float(top)]


def scenarios(quick: bool) -> list[Scenario]:
    if quick:
        return [Scenario(FAST, 1)]
    return [Scenario(FAST, 1), Scenario(FAST, 2), Scenario(SLOW, 1), Scenario(SLOW, 2)]


def measured_commit() -> str:
    """HEAD, and whether the tree's services/ differs from it (measured before its commit)."""
    git = shutil.which("git")
    if git is None:
        return "unknown"
    head, changes = (subprocess.run([git, *argv], capture_output=True, text=True,  # noqa: S603
                                    cwd=ROOT, check=False).stdout.strip()
                     for argv in (["rev-parse", "--short", "HEAD"],
                                  ["status", "--porcelain", "--", "services"]))
    if not head:
        return "unknown"
    return head + (" with uncommitted changes to services/" if changes else "")


def machine() -> list[str]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), "0")
    return [f"- machine: {os.cpu_count()} cores ({cpu}), {int(memory) / 1024**2:.0f} GiB, "
            f"Linux {platform.release()}, Python {platform.python_version()}",
            f"- Ferry commit {measured_commit()}; default settings (max batch 64, max wait "
            f"{MAX_WAIT_MS:g} ms, adaptive flush on, one gateway process per core, one "
            "batcher, in-flight batches = Triton instances); Triton from the nvidia-pytriton "
            "wheel, the sim model on the Python backend (its time is spent sleeping: no CPU)",
            "- load: open loop, Poisson arrivals drawn in advance, 2 KB payloads, latency from "
            "each request's scheduled send to its answer (HdrHistogram); every answer checked; "
            "the generator runs on the same 2 cores; each rate runs 3-6 s; a system's sweep "
            "stops at the first rate it cannot serve"]


def machine_brief() -> str:
    """This machine in a few words, and the commit measured (for a section run alone)."""
    return machine()[0].removeprefix("- machine: ") + "; " + machine()[1].removeprefix(
        "- ").split(";")[0]


async def profile(stack: BenchStack, scenario: Scenario, folder: Path
                  ) -> tuple[dict[str, list[object]], str]:
    """py-spy of the gateway workers and the batcher while Ferry serves 400/s."""
    if py_spy() is None:
        return {}, "py-spy is not installed: no profile in this run."
    load = asyncio.create_task(run("ferry-1req", stack.gateway_url, scenario.model("ferry-1req"),
                                   400.0, 3600, seed=99))
    await asyncio.sleep(1.0)
    targets = {f"gateway-{pid}": pid for pid in stack.pids["gateway"][1:]}
    targets["batcher"] = stack.pids["batcher"][0]
    outputs = {name: folder / f"{name}.raw" for name in targets}
    done = await asyncio.gather(*(record(pid, 6, outputs[name])
                                  for name, pid in targets.items()))
    await load
    merged: dict[str, list[object]] = {}
    gateway_raw = folder / "gateway.raw"
    gateway_raw.write_text("".join(outputs[n].read_text() for n, ok in zip(targets, done,
                                                                            strict=True)
                                   if ok and n.startswith("gateway")))
    for name, raw in (("gateway (all workers)", gateway_raw), ("batcher", outputs["batcher"])):
        if raw.exists():
            merged[name] = list(hotspots(raw))
    note = ("py-spy record --gil (samples only while the process runs Python), 6 s at 400/s, "
            "in a run of its own after the sweep. Time spent in system calls (socket writes, "
            "waking another process) is charged to the Python line that made them.")
    return merged, note


@dataclass
class Extras:
    """What a run measures beside the sweep's points."""

    floors: dict[str, float] = field(default_factory=dict)
    spots: dict[str, list[object]] = field(default_factory=dict)
    note: str = ""
    goodput_s: float = 0.0
    faults: list[versus.FaultRun] = field(default_factory=list)
    peers_note: str = ""


async def measure_all(args: argparse.Namespace, stack: BenchStack, chosen: list[Scenario],
                      sweep: Sweep, goodput: GoodputBench) -> Extras:
    """The parts ``--only`` asks for, in order: the sweep (with its repeats, the machine's
    floors and the profile), then the goodput searches."""
    extras = Extras(note="not taken in a --quick run" if args.quick else "")
    if args.only in ("all", "sweep"):
        for scenario in chosen:
            for system in SYSTEMS:
                await sweep.warm_up(scenario, system)
                await sweep.system(scenario, system, rates(scenario, args.quick))
            if args.peers:
                extras.faults += await versus.sweep_peers(
                    sweep, scenario, rates(scenario, args.quick), stack.state,
                    fault=scenario == versus.FAULT_SCENARIO)
        if args.peers and versus.FAULT_SCENARIO in chosen:
            extras.faults.insert(0, await versus.ferry_fault(stack, versus.FAULT_SCENARIO))
        extras.peers_note = peers_note(args)
        if not args.quick:
            await sweep.repeat(chosen[0], ("ferry-1req", "ferry-2req", "triton-dyn0"),
                               (50.0, 400.0), rounds=2)
        exchanges = await http_floors((50.0, 400.0) if args.quick else EXCHANGE_RATES)
        extras.floors = {**{exchange_name(rate): us for rate, us in exchanges.items()},
                         REDIS_FLOOR: await redis_floor(stack.redis_url,
                                                        stack.pids["redis"][0])}
        (stack.state / "floors.json").write_text(json.dumps(
            {"exchange": {str(rate): us for rate, us in exchanges.items()},
             "redis": extras.floors[REDIS_FLOOR]}))
        if not args.quick:
            extras.spots, extras.note = await profile(stack, chosen[0], stack.state)
    if args.only in ("all", "goodput"):
        started = time.monotonic()
        for scenario in chosen:
            await goodput.scenario(scenario)
            await goodput.pinned(scenario)
            await goodput.told_the_slo(scenario)
        extras.goodput_s = time.monotonic() - started
    return extras


async def keep_up(args: argparse.Namespace, state: Path) -> None:
    """Ten fresh stacks at 78% of the slow backend (two of 3 s in a quick run), then ten more
    (one) with a busy loop of half a core beside each: its section."""
    started = datetime.datetime.now(datetime.UTC)
    runs, seconds = (2, 3.0) if args.quick else (keepup.RUNS, keepup.SECONDS)
    records = await keepup.keepup(runs, seconds, keepup.SHARE, state / "keepup")
    (state / "keepup" / "keepup.json").write_text(json.dumps([asdict(r) for r in records]))
    burnt = await keepup.keepup(1 if args.quick else runs, seconds, keepup.SHARE,
                                state / "keepup-burn", burn=keepup.BURN)
    (state / "keepup" / "keepup-burn.json").write_text(json.dumps([asdict(r) for r in burnt]))
    note = (f"Measured by `{args.command}` on {started:%Y-%m-%d %H:%M} UTC "
            f"({runs} runs of {seconds:g} s, then {len(burnt)} with the busy loop).")
    out = Path(args.out)
    lines = keepup.section(records, keepup.offered(), note, burnt)
    out.write_text(replace_section(out.read_text() if out.exists() else "", lines,
                                   keepup.HEADING))


async def section_alone(args: argparse.Namespace, state: Path) -> bool:
    """A part that writes its section of --out alone (``--only`` keepup, jobs, durability,
    recovery, fairness, pool, redis-clients, peers-report); False for the others."""
    out = Path(args.out)
    if args.only == "keepup":
        await keep_up(args, state)
        goals.write(out, state)
    elif args.only == "jobs":
        await jobs.write_section(out, Path(args.figures), state, args.quick, args.command)
    elif args.only == "peers-report":
        versus.rewrite(out, state, scenarios(args.quick), MAX_WAIT_MS)
    elif args.only == "durability":
        await asyncio.to_thread(durability.write_section, out, state, args.quick, args.command)
    elif args.only == "recovery":
        await recovery.write_section(out, state, args.quick, args.command, machine_brief())
    elif args.only == "fairness":
        await fair_share(args, state)
    elif args.only == "pool":
        await pool.write_section(out, state, args.quick, args.command, machine_brief())
    elif args.only == "kill-row":
        await kill_row(args, state)
    elif args.only == "redis-clients":
        await redis_clients.write_section(out, state, args.quick, args.command, machine_brief())
    else:
        return False
    log.info("wrote the %s section of %s", args.only, out)
    return True


async def bench(args: argparse.Namespace) -> int:
    state = Path(args.state).resolve()
    if await section_alone(args, state):
        return 0
    chosen = scenarios(args.quick)
    if args.only != "sweep":
        perf_analyzer()  # missing: say so now, not after the sweep
    repository = write_repository(state / "models", chosen, MAX_WAIT_MS)
    stack = BenchStack(state, repository)
    started = datetime.datetime.now(datetime.UTC)
    log.info("starting tritonserver (%d models), Redis and Ferry ...", 3 * len(chosen))
    stack.start(default_model=chosen[0].model("ferry-1req"))
    stats = TritonStats(stack.triton_grpc)
    sweep = Sweep(stack, stats, quick=args.quick)
    goodput = GoodputBench(stack, state / "perf_analyzer", MAX_WAIT_MS, quick=args.quick)
    try:
        extras = await measure_all(args, stack, chosen, sweep, goodput)
    finally:
        await stats.close()
        stack.stop()
    elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
    (state / "goodput.json").write_text(json.dumps([g.to_json() for g in goodput.results]))
    lines = section(goodput.results, chosen, goodput_note(args, started, extras.goodput_s))
    out = Path(args.out)
    if args.only == "goodput":
        out.write_text(replace_section(out.read_text() if out.exists() else "", lines))
        goals.write(out, state)
        log.info("wrote the goodput section of %s in %.1f min", out, elapsed)
        return 0
    header = ["# Ferry against Triton alone", "", generated(args.command, started, elapsed),
              "", *machine()]
    report = Report(sweep.points, chosen, header, MAX_WAIT_MS, extras.floors,
                    extras.spots, extras.note,  # type: ignore[arg-type]
                    goodput=lines if goodput.results else [],
                    peers=versus.section(sweep.points, chosen, extras.faults, MAX_WAIT_MS,
                                         extras.peers_note))
    versus.save(state, extras.faults, extras.peers_note)
    write(report, args, state, sweep)
    await keep_up(args, state)
    await jobs.write_section(out, Path(args.figures), state, args.quick, args.command)
    await asyncio.to_thread(durability.write_section, out, state, args.quick, args.command)
    await recovery.write_section(out, state, args.quick, args.command, machine_brief())
    if not args.quick:  # their smoke runs are tests of their own (test_bench_fairness.py,
        # test_redis_clients_bench.py)
        await fair_share(args, state)
        await pool.write_section(out, state, args.quick, args.command, machine_brief())
        await redis_clients.write_section(out, state, args.quick, args.command,
                                          machine_brief())
    goals.write(out, state)
    total = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
    restamp(out, generated(args.command, started, total, sweep_minutes=elapsed))
    log.info("wrote %s and its figures in %.1f min", out, total)
    return 0


def generated(command: str, started: datetime.datetime, minutes: float, *,
              sweep_minutes: float | None = None) -> str:
    """The report's first line: when, how long (the whole run's time once it has ended; the
    report is first written after the sweep and the goodput searches)."""
    took = (f"{minutes:.1f} minutes ({sweep_minutes:.1f} of them until the sweep's report, "
            "then the sections after it)" if sweep_minutes is not None
            else f"{minutes:.1f} minutes")
    return (f"Generated by `{command}` on {started:%Y-%m-%d %H:%M} UTC in {took}. Every figure "
            "below comes from that one run; regenerate them with the same command.")


def restamp(out: Path, line: str) -> None:
    """Put ``line`` in place of the report's "Generated by" line."""
    lines = out.read_text().split("\n")
    at = next((i for i, text in enumerate(lines) if text.startswith("Generated by `")), None)
    if at is not None:
        lines[at] = line
        out.write_text("\n".join(lines))


def write(report: Report, args: argparse.Namespace, state: Path, sweep: Sweep) -> None:
    """The report, its two figures and the sweep's raw points."""
    out, figures = Path(args.out), Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    curves, cpu = figures / "operating-curves.png", figures / "cpu-per-inference.png"
    report.draw(curves, cpu)
    # the GPU kit's section is measured elsewhere (a lent GPU machine): a run here keeps it
    gpu = section_of(out.read_text(), GPU_HEADING) if out.exists() else []
    text = report.markdown([os.path.relpath(f, out.parent) for f in (curves, cpu)])
    out.write_text(replace_section(text, gpu, GPU_HEADING) if gpu else text)
    (state / "results.json").write_text(json.dumps([p.to_json() for p in sweep.points]))


async def fair_share(args: argparse.Namespace, state: Path) -> None:
    """A flood beside a light client: FIFO, fair share, and the light client alone."""
    await fairness.write_section(Path(args.out), Path(args.figures), state, quick=args.quick,
                                 command=args.command, machine=machine_brief())


async def kill_row(args: argparse.Namespace, state: Path) -> None:
    """The peers' kill -9 table again, alone (Ferry, and the peers when installed)."""
    started = datetime.datetime.now(datetime.UTC)
    faults = await versus.kill_row(state / "kill-row", MAX_WAIT_MS, with_peers=args.peers)
    measured = ", ".join(versus.LABELS[f.system] for f in faults)
    note = (f"This table: measured by `{args.command}` on {started:%Y-%m-%d %H:%M} UTC "
            f"({machine_brief()}), apart from the rest of this section: {measured}"
            + ("" if len(faults) > 1 else f" only ({peers_note(args)})") + ".")
    out = Path(args.out)
    out.write_text(versus.replace_faults(out.read_text(), faults, note))


def peers_note(args: argparse.Namespace) -> str:
    if not args.peers:
        return "the peers were left out of this run (--no-peers; a --quick run leaves them out)"
    if not peers.installed():
        return "the peers' venv is missing (make peers installs it)"
    return (f"Measured by `{args.command}` in the same run as the tables above, on the same "
            "Triton.")


def goodput_note(args: argparse.Namespace, started: datetime.datetime, seconds: float) -> str:
    """How the goodput table was measured, in the words of the run that measured it."""
    return (f"Measured by `{args.command}` on {started:%Y-%m-%d %H:%M} UTC (this part took "
            f"{seconds / 60:.1f} minutes). " + GOODPUT_METHOD)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: every section at "
                        "its smallest, about 3-4 minutes on 2 cores; not a measurement")
    parser.add_argument("--only", default="all",
                        choices=("all", "sweep", "goodput", "keepup", "jobs", "durability",
                                 "recovery", "fairness", "pool", "redis-clients", "kill-row",
                                 "peers-report"),
                        help="sweep: the Python generator's sweep, floors and profile; goodput: "
                             "perf_analyzer's goodput at the SLO alone, which replaces that "
                             "section of --out and leaves the rest of it as it was; keepup: "
                             "ten fresh stacks at 78%% of the slow backend, that section alone; "
                             "jobs: the bulk-jobs section alone; recovery: each fault under "
                             "load and its recovery time, that section alone; fairness: a "
                             "flood at twice the slow backend's capacity beside a light client "
                             "(FIFO, fair share, the light client alone), that section alone; "
                             "pool: 1 and 2 Tritons, 1, 2 and 4 batchers, against Triton "
                             "alone round robin, that section alone; redis-clients: "
                             "ferry.resp against redis-py and coredis on Ferry's hot-path "
                             "commands (client CPU per command), that section alone; "
                             "kill-row: the "
                             "peers' kill -9 table again, alone; peers-report: "
                             "the peers' section again from --state's raw results, nothing "
                             "measured")
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                        help="run Ray Serve, BentoML and LitServe beside Ferry in the sweep "
                             "(default: yes, but not in a --quick run; make peers installs them)")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--figures", default=str(ROOT / "docs"))
    parser.add_argument("--state", default=str(ROOT / ".bench"),
                        help="logs, Triton's model repository and raw results")
    args = parser.parse_args()
    if args.peers is None:
        args.peers = not args.quick
    args.command = " ".join(["make bench" if not args.quick and args.only == "all"
                             else "python -m loadtest.bench",
                             *(["--quick"] if args.quick else []),
                             *([f"--only {args.only}"] if args.only != "all" else [])])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    return uvloop.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
