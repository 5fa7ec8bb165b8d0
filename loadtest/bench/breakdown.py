"""Where a task's CPU goes: one tree, one rate, each process's CPU and context switches per task,
and what Redis ran per task (its own ``INFO commandstats``).

docs/performance.md's breakdown ("Where a task's CPU goes") is measured with it, so that it can be
measured again as it was: the fast sim backend, one tritonserver, one Redis, Ferry's gateway (a
worker per core) and one batcher, loopback only, a warm-up not counted (``--flow grpc``: Triton's
gRPC ModelInfer at the gateway's gRPC port)::

    .venv/bin/python -m loadtest.bench.breakdown --rate 400 --seconds 12 --flow ferry-2req

The figures are one run's: compare trees with ``loadtest.bench.ab`` (interleaved), not with two
runs of this at different times.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis
import uvloop

from ferry.stack.ports import LOOPBACK
from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import start_redis
from ferry.stack.triton_server import start_triton
from loadtest.bench.ab import FLOW_HELP, FLOWS, start_ferry
from loadtest.bench.backends import FAST, Scenario, write_repository
from loadtest.bench.cpu import cpu_seconds, family
from loadtest.generator import run

SHOWN = 8  # Redis commands listed, those Redis spent the most time on first (a script's own
# commands are counted under their names as well as in its EVALSHA)


def switches(pid: int) -> int:
    """Context switches (voluntary and not) of every thread of ``pid`` so far."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in text.splitlines()
                     if "ctxt_switches:" in line)
    return total


def commandstats(client: redis.Redis) -> dict[str, tuple[int, float]]:
    """Redis's own count and µs of each command so far (scripts under ``evalsha``)."""
    stats: Mapping[str, Mapping[str, float]] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in stats.items()}


@dataclass(frozen=True)
class Snapshot:
    cpu: dict[str, float]  # seconds, by process group
    switches: dict[str, int]
    commands: dict[str, tuple[int, float]]  # Redis's, by name

    @classmethod
    def take(cls, groups: Mapping[str, list[int]], client: redis.Redis) -> Snapshot:
        return cls({k: sum(cpu_seconds(p) for p in v) for k, v in groups.items()},
                   {k: sum(switches(p) for p in v) for k, v in groups.items()},
                   commandstats(client))


def report(before: Snapshot, after: Snapshot, tasks: int, latency: tuple[float, float]) -> str:
    """The run's figures per task, in words and a table."""
    cpu = {k: (after.cpu[k] - before.cpu[k]) * 1e6 / tasks for k in before.cpu}
    ctx = {k: (after.switches[k] - before.switches[k]) / tasks for k in before.switches}
    ran = {name: (calls - before.commands.get(name, (0, 0.0))[0],
                  usec - before.commands.get(name, (0, 0.0))[1])
           for name, (calls, usec) in after.commands.items()}
    ran = {name: v for name, v in ran.items() if v[0] > 0}
    lines = [f"{tasks} tasks, p50 {latency[0]:.1f} ms, p99 {latency[1]:.1f} ms",
             "CPU per task: " + " + ".join(f"{k} {v:,.0f}" for k, v in cpu.items())
             + f" = {sum(cpu.values()):,.0f} µs",
             "context switches per task: " + ", ".join(f"{k} {v:.2f}" for k, v in ctx.items()),
             "", "| Redis command | per task | µs each (Redis's own) |", "|---|---|---|"]
    for name, (calls, usec) in sorted(ran.items(), key=lambda kv: -kv[1][1])[:SHOWN]:
        lines.append(f"| {name} | {calls / tasks:.2f} | {usec / calls:.0f} |")
    return "\n".join(lines)


def measured(args: argparse.Namespace, state: Path, redis_proc: ManagedProcess,
             redis_url: str, triton: tuple[str, str], model: str) -> str:
    ferry = start_ferry(str(Path(args.tree).resolve()), state, triton=triton[0],
                        triton_http=triton[1], redis_url=redis_url, model=model,
                        flow=args.flow)
    flow, target = ferry.target(args.flow)
    try:
        groups = {name: family(proc.pid or 0) for name, proc in ferry.procs.items()}
        groups["redis"] = [redis_proc.pid or 0]
        client = redis.Redis.from_url(redis_url)
        count = int(args.rate * args.seconds)
        before = Snapshot.take(groups, client)
        result = uvloop.run(run(flow, target, model, args.rate, count, seed=11))
        after = Snapshot.take(groups, client)
        return report(before, after, count, (result.p50_ms, result.p99_ms))
    finally:
        ferry.stop()


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default="services", help="the services/ directory to run")
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--flow", choices=FLOWS, default="ferry-2req", help=FLOW_HELP)
    args = parser.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="ferry-breakdown-"))
    scenario = Scenario(FAST, 1)
    triton, ports = start_triton(write_repository(state / "models", [scenario], 50),
                                 state / "triton")
    redis_proc, redis_url = start_redis(state / "redis")
    try:
        out(measured(args, state, redis_proc, redis_url,
                     (f"{LOOPBACK}:{ports.grpc}", f"{LOOPBACK}:{ports.http}"), scenario.name))
    finally:
        redis_proc.stop()
        triton.stop()


if __name__ == "__main__":
    main()
