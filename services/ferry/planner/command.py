"""``ferry plan fit | size | curve``: the command line of the planner."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from ferry.errors import ConfigError, FerryError
from ferry.planner import arrivals as arrival_kinds
from ferry.planner.costs import DEFAULT_SIZES, CostModel
from ferry.planner.cpu import BENCH_CPU, BENCH_EXCHANGE_US, CpuCost
from ferry.planner.deployment import Deployment, Outcome
from ferry.planner.layout import Layout
from ferry.planner.memory import (
    RedisLoad,
    RedisSizes,
    byte_size,
    human,
    maxmemory,
    redis_memory,
)
from ferry.planner.progress import ProgressLine, ms
from ferry.planner.search import (
    BATCHER_TASKS_PER_S,
    GATEWAY_TASKS_PER_S,
    Arrivals,
    Sizing,
    Target,
    size,
)
from ferry.planner.simulate import simulate
from ferry.stack.state import TRITON_URL_FILE, kept

OVERHEAD_S = 0.003  # Ferry's latency per task, its CPU included (make bench: 4-5 ms at 50/s)
OVERHEAD_WITH_CPU_S = 0.0015  # ... besides its processes' CPU, which the simulation queues


def add_parser(commands: Any) -> None:
    plan = commands.add_parser("plan", help="fit a model's batch cost, simulate Ferry's policy, "
                               "size a deployment")
    actions = plan.add_subparsers(dest="action", required=True)
    fit = actions.add_parser("fit", help="measure t(B) = t_fixed + B * t_per")
    fit.add_argument("--triton-url", help="Triton's own gRPC host:port, for a sweep of batch "
                     "sizes (default: the one `ferry up` started, kept in .ferry/triton-url "
                     "here or in a directory above; Ferry's port is refused)")
    fit.add_argument("--model", help="the model to profile")
    fit.add_argument("--from-stats", type=Path, help="fit from Triton's statistics saved to a "
                     "file (GET /v2/models/<m>/stats), offline")
    fit.add_argument("--live-stats", action="store_true", help="fit from the live server's "
                     "statistics (after real traffic) instead of a sweep")
    fit.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_SIZES)))
    fit.add_argument("--repeats", type=int, default=10, help="timed calls per batch size")
    fit.add_argument("--payload-bytes", type=int, default=1024)
    fit.add_argument("--input", type=Path, help="a file sent as every item of the sweep (an "
                     "image, a text: what the model serves), instead of the model's sample")
    fit.add_argument("--out", type=Path, help="write the fit as JSON here (for --fit)")
    fit.add_argument("--json", action="store_true", help="print JSON instead of a table")

    _size_arguments(actions.add_parser("size", help="the cheapest deployment for a load and "
                                       "a p99"))

    curve = actions.add_parser("curve", help="draw p99 against QPS for a few configurations")
    _cost_arguments(curve)
    curve.add_argument("--configs", default="1x64x50,2x64x50,4x64x50",
                       help="instances x max batch x max wait ms, comma-separated")
    curve.add_argument("--p99-ms", type=float, help="draw this target too")
    curve.add_argument("--points", type=int, default=12, help="loads per configuration")
    curve.add_argument("--out", type=Path, default=Path("operating-curve.png"))
    curve.add_argument("--json", action="store_true", help="also print the points as JSON")


def _size_arguments(sizing: argparse.ArgumentParser) -> None:
    sizing.add_argument("--qps", type=float, required=True)
    sizing.add_argument("--p99-ms", type=float, required=True)
    _cost_arguments(sizing, seconds=20.0, seconds_help="simulated time of each run after the "
                    "search: the headroom's at the design load and the figures' (default 20)")
    sizing.add_argument("--headroom", type=float, default=0.2,
                        help="the p99 must hold at qps * (1 + headroom) (default 0.2)")
    sizing.add_argument("--max-batch", type=int, default=64, help="the model's max_batch_size")
    _replica_arguments(sizing)
    sizing.add_argument("--max-queue-wait-s", type=float, default=10.0,
                        help="Ferry's admission (FERRY_MAX_QUEUE_WAIT_S): arrivals past what "
                        "the instances serve in this time are refused (0: no limit)")
    sizing.add_argument("--cpu-costs", type=Path, help="Ferry's CPU per task and per batch of "
                        "each process (JSON: gateway_task_us, gateway_batch_us, batcher_task_us, "
                        "batcher_batch_us, redis_task_us, redis_batch_us); default: make bench's")
    sizing.add_argument("--cpu-scale", type=float, default=1.0,
                        help="every CPU cost times this: what a bare HTTP exchange costs on your "
                        "node (python -m loadtest.bench.floor) over what it cost where the "
                        f"costs were measured ({BENCH_EXCHANGE_US:,.0f} us for make bench's; "
                        "default 1)")
    sizing.add_argument("--no-cpu", action="store_true", help="leave Ferry's CPU out of the "
                        "simulation (a fixed overhead per task) and size processes by tasks/s")
    sizing.add_argument("--gateway-tasks-per-s", type=float, default=GATEWAY_TASKS_PER_S,
                        help="with --no-cpu: tasks/s one gateway process serves")
    sizing.add_argument("--batcher-tasks-per-s", type=float, default=BATCHER_TASKS_PER_S,
                        help="with --no-cpu: tasks/s one batcher serves")
    sizing.add_argument("--no-riders", action="store_true", help="size for "
                        "FERRY_BUDGET_RIDERS=false: batchers sharing the budget take slots "
                        "first come, first served, each with only its own tasks (default: the "
                        "fleet's one queue, as Ferry)")
    _redis_arguments(sizing)
    sizing.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _replica_arguments(sizing: argparse.ArgumentParser) -> None:
    """How the instances are laid out on Triton replicas (ferry.planner.layout)."""
    sizing.add_argument("--replicas", type=_at_least_one, help="the Triton replicas you have: "
                        "size the instances on each (default: the fewest that hold them)")
    each = sizing.add_mutually_exclusive_group()
    each.add_argument("--instances-per-replica", type=_at_least_one,
                      help="every replica's instance_group count, fixed")
    each.add_argument("--max-instances-per-replica", type=_at_least_one,
                      help="the most instances a replica runs at the fitted t(B) (default 1: "
                           "a replica a GPU; no bound with --replicas)")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number of at least 1, not {text!r}")
    return value


def _redis_arguments(sizing: argparse.ArgumentParser) -> None:
    """What sizes Redis' memory (ferry.planner.memory): sizes take K, M, G (powers of 1024)."""
    sizing.add_argument("--payload-bytes", type=byte_size, default=2048,
                        help="a request's payload, for Redis' memory (default 2K)")
    sizing.add_argument("--output-bytes", type=byte_size, default=256,
                        help="an answer's JSON, as a result's 'output' (default 256)")
    sizing.add_argument("--result-ttl-s", type=float, default=600.0,
                        help="FERRY_RESULT_TTL_S: how long results are kept (default 600)")
    sizing.add_argument("--cache-ttl-s", type=float, default=300.0,
                        help="FERRY_CACHE_TTL_S: how long answers are cached (default 300; 0: "
                        "no cache)")


def _cost_arguments(parser: argparse.ArgumentParser, seconds: float = 60.0,
                    seconds_help: str = "simulated time per run (default 60)") -> None:
    parser.add_argument("--fit", type=Path, help="a fit file from ferry plan fit --out")
    parser.add_argument("--t-fixed-ms", type=float, help="t(B)'s fixed part, ms")
    parser.add_argument("--t-per-ms", type=float, help="t(B)'s part per item, ms")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="spread of a call, ms")
    parser.add_argument("--arrivals", choices=arrival_kinds.KINDS, default="poisson")
    parser.add_argument("--trace", type=Path, help="arrival times, one per line (seconds)")
    parser.add_argument("--overhead-ms", type=float,
                        help="Ferry's own latency per task besides its processes' CPU (network "
                        "hops, wake-ups); default 1.5 ms, or 3 ms where its CPU is not "
                        "simulated (--no-cpu, curve)")
    parser.add_argument("--seconds", type=float, default=seconds, help=seconds_help)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "fit":
            return _fit(args)
        if args.action == "size":
            return _size(args)
        return _curve(args)
    except (FerryError, OSError) as exc:
        print(f"ferry plan {args.action}: {exc}", file=sys.stderr)
        return 2


# -- fit ----------------------------------------------------------------------------------------

def _fit(args: argparse.Namespace) -> int:
    # Triton's client and numpy take longer to import than the rest of the command: only a fit
    # needs them.
    import asyncio  # noqa: PLC0415

    from ferry.planner.profile import (  # noqa: PLC0415
        from_statistics,
        live_statistics,
        sweep,
    )

    if not args.from_stats and not args.triton_url:
        args.triton_url = kept(TRITON_URL_FILE)[0]  # the local stack's, if it runs here
    if args.from_stats:
        stats = json.loads(args.from_stats.read_text())
        cost = from_statistics(stats, args.model or "")
    elif not args.triton_url or not args.model:
        raise ConfigError("give --model, and --triton-url where `ferry up` has not started "
                          "Triton here (or --from-stats FILE)")
    elif args.live_stats:
        cost = from_statistics(asyncio.run(live_statistics(args.triton_url, args.model)),
                               args.model)
    else:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
        sample = args.input.read_bytes() if args.input else None
        cost = asyncio.run(sweep(args.triton_url, args.model, sizes=sizes,
                                 repeats=args.repeats, payload_bytes=args.payload_bytes,
                                 sample=sample))
    if args.out:
        args.out.write_text(json.dumps(cost.to_json(), indent=2) + "\n")
    if args.json:
        print(json.dumps(cost.to_json(), indent=2))
    else:
        print(fit_table(cost))
    return 0


def fit_table(cost: CostModel) -> str:
    lines = [f"t(B) = {cost.fixed_s * 1e3:.3f} + {cost.per_item_s * 1e3:.4f} * B ms   "
             f"(R² {cost.r2:.3f}, residual sd {cost.jitter_s * 1e3:.3f} ms, from {cost.source}"
             f"{', ' + cost.model if cost.model else ''})",
             "", f"{'batch':>5} {'measured ms':>12} {'fitted ms':>10} {'calls':>6}"]
    lines += [f"{b:>5} {t * 1e3:>12.3f} {cost.time(b) * 1e3:>10.3f} {w:>6.0f}"
              for b, t, w in _by_batch(cost.points)]
    return "\n".join(lines)


def _by_batch(points: Sequence[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """Mean seconds and total weight per batch size."""
    merged: dict[int, tuple[float, float]] = {}
    for batch, seconds, weight in points:
        total, count = merged.get(batch, (0.0, 0.0))
        merged[batch] = (total + seconds * weight, count + weight)
    return [(b, total / count, count) for b, (total, count) in sorted(merged.items())]


# -- size ---------------------------------------------------------------------------------------

def cost_of(args: argparse.Namespace) -> CostModel:
    if args.fit:
        return CostModel.load(args.fit)
    if args.t_fixed_ms is None or args.t_per_ms is None:
        raise ConfigError("give --fit FILE, or --t-fixed-ms and --t-per-ms")
    return CostModel(args.t_fixed_ms / 1e3, args.t_per_ms / 1e3, args.jitter_ms / 1e3)


def arrivals_of(args: argparse.Namespace) -> Arrivals:
    if args.arrivals == "trace":
        if args.trace is None:
            raise ConfigError("--arrivals trace needs --trace FILE")
        arrival_kinds.trace(args.trace)  # refused now if unreadable, not after a search
        return lambda qps, seconds, seed: arrival_kinds.trace(args.trace, qps, seconds)
    return partial(arrival_kinds.generate, args.arrivals)


def cpu_of(args: argparse.Namespace) -> CpuCost | None:
    if args.no_cpu:
        if args.cpu_costs or args.cpu_scale != 1.0:
            raise ConfigError("--cpu-costs and --cpu-scale exclude --no-cpu")
        return None
    if not 0 < args.cpu_scale <= 100:
        raise ConfigError(f"--cpu-scale must be > 0 and <= 100, got {args.cpu_scale:g}")
    return (CpuCost.load(args.cpu_costs) if args.cpu_costs else BENCH_CPU).scaled(args.cpu_scale)


def overhead_of(args: argparse.Namespace, cpu: CpuCost | None) -> float:
    if args.overhead_ms is not None:
        return float(args.overhead_ms) / 1e3
    return OVERHEAD_WITH_CPU_S if cpu is not None else OVERHEAD_S


def target_of(args: argparse.Namespace) -> Target:
    """What ``ferry plan size`` sizes for, from its arguments."""
    cpu = cpu_of(args)
    return Target(qps=args.qps, p99_s=args.p99_ms / 1e3, headroom=args.headroom,
                  max_batch_limit=args.max_batch, overhead_s=overhead_of(args, cpu), cpu=cpu,
                  max_queue_wait_s=args.max_queue_wait_s,
                  layout=Layout(args.replicas or 0, args.instances_per_replica or 0,
                                args.max_instances_per_replica or 0),
                  gateway_tasks_per_s=args.gateway_tasks_per_s,
                  batcher_tasks_per_s=args.batcher_tasks_per_s,
                  check_seconds=args.seconds, seed=args.seed, riders=not args.no_riders)


def _size(args: argparse.Namespace) -> int:
    cost, target = cost_of(args), target_of(args)
    with ProgressLine() as progress:
        sizing = size(cost, target, arrivals_of(args), progress)
    redis = RedisSizes(args.payload_bytes, args.output_bytes, args.result_ttl_s,
                       args.cache_ttl_s)
    if args.json:
        print(json.dumps(sizing_json(sizing, args.arrivals, redis), indent=2))
    else:
        print(sizing_table(sizing, args.arrivals, redis))
    return 0


def sizing_table(s: Sizing, arrivals: str = "poisson", redis: RedisSizes | None = None) -> str:
    """The plan as a table; with ``redis`` (its sizes and TTLs), Redis' memory too."""
    t, d, cost = s.target, s.deployment, s.cost
    load = t.qps / s.capacity
    rows = [
        ("Triton replicas", f"{d.replicas}, each running {_instances(d.instances_per_replica)} "
                            f"of the model (instance_group count {d.instances_per_replica})"),
        ("GPU instances (Triton model instances)",
         f"{d.instances} in all: the in-flight budget, {d.instances} batches at once"),
        ("batchers", f"{d.batchers}" + _sharing(d)),
        ("partitions", f"{s.partitions}"),
        ("gateways", f"{s.gateways} processes (one per core)"),
        ("Redis", "one server" if s.redis_shards == 1
         else f"a Redis Cluster of {s.redis_shards} masters"),
        *(memory_rows(s, redis) if redis is not None else []),
        ("max batch / max wait", f"{d.max_batch} / {ms(d.max_wait_s)} (adaptive flush on)"
                                 + (f", FERRY_SLO_MS={d.slo_s * 1e3:.0f}" if d.slo_s else "")),
        (f"predicted at {t.qps:,.0f}/s", _outcome(s.at_target)),
        (f"predicted at {t.design_qps:,.0f}/s (+{t.headroom:.0%})",
         f"{_outcome(s.at_design)} (the worst of {len(s.design_p99s)} runs)"),
        *([("CPU busy there (busiest process)", _cpu_busy(s.at_design))]
          if s.at_design.cpu_busy else []),
        (f"p99 promised at {t.design_qps:,.0f}/s", _promise(s)),
        ("capacity at full batches", f"{s.capacity:,.0f}/s (the target is {load:.0%} of it)"),
        ("back of the envelope",
         f"{s.envelope_instances} instances ({t.max_batch_limit} / "
         f"{ms(cost.time(t.max_batch_limit))} = {cost.throughput(t.max_batch_limit):,.0f}/s "
         f"each): {_envelope(s)} at {t.qps:,.0f}/s"),
    ]
    width = max(len(name) for name, _ in rows)
    head = (f"Ferry plan: {t.qps:,.0f}/s with p99 < {ms(t.p99_s)}, t(B) = "
            f"{cost.fixed_s * 1e3:g} + {cost.per_item_s * 1e3:g}·B ms, {arrivals} arrivals, "
            f"Ferry overhead {ms(t.overhead_s)}"
            + (" + its processes' CPU" if t.cpu is not None else "")
            + f" ({s.candidates} simulated runs)")
    return "\n".join([head, ""] + [f"{name:<{width}}  {value}" for name, value in rows]
                     + ["", why(s)])


def _sharing(d: Deployment) -> str:
    """How several batchers share the budget."""
    if d.batchers == 1:
        return ""
    return (", sharing the budget through Redis (FERRY_INFLIGHT_BUDGET=auto)"
            + ("" if d.riders else ", first come, first served (FERRY_BUDGET_RIDERS=false)"))


def _instances(count: int) -> str:
    return f"{count} instance{'s' if count > 1 else ''}"


def redis_loads(s: Sizing, sizes: RedisSizes) -> tuple[RedisLoad, RedisLoad]:
    """What Redis holds at the target load and at the design load: results at the arrival
    rate, unfinished tasks up to the backlog bound (without one, as many as the simulation's
    mean time in Ferry lets arrive: Little's law)."""
    t, bound = s.target, s.deployment.max_backlog

    def at(rate: float, outcome: Outcome) -> RedisLoad:
        return sizes.at(rate, bound or math.ceil(rate * outcome.mean_s))

    return at(t.qps, s.at_target), at(t.design_qps, s.at_design)


def memory_rows(s: Sizing, sizes: RedisSizes) -> list[tuple[str, str]]:
    """Redis' memory at the target load, and the maxmemory for the design load."""
    load, design = redis_loads(s, sizes)
    memory, masters = redis_memory(load), s.redis_shards
    each = f" on each of its {masters} masters" if masters > 1 else ""
    cache = (f", {load.cache_entries:,.0f} cache entries {human(memory.cache)}"
             if load.cache_entries else "")
    unfinished = ("the backlog bound" if s.deployment.max_backlog
                  else "no backlog bound: the mean in Ferry")
    return [
        ("Redis memory", f"{human(memory.total)} at {load.rate_per_s:,.0f}/s with "
                         f"{human(sizes.payload_bytes)} payloads, results kept "
                         f"{sizes.result_ttl_s:g} s; set maxmemory ≥ "
                         f"{human(maxmemory(design, masters))}{each}, noeviction"),
        ("Redis memory by part",
         f"{load.unfinished:,} unfinished tasks ({unfinished}) {human(memory.unfinished)}, "
         f"{load.kept_results:,.0f} results of {human(sizes.output_bytes)} "
         f"{human(memory.results)}{cache}, fixed {human(memory.fixed)}"),
    ]


def _promise(s: Sizing) -> str:
    """The headroom: the p99 one more run at the design load would stay under, and the runs'."""
    t, bound = s.target, s.design_bound_s
    runs = ", ".join(f"{p99 * 1e3:,.0f}" for p99 in s.design_p99s)
    return (f"{ms(bound)}, {1 - bound / t.p99_s:.0%} under the target: one more run stays under "
            f"it 19 times in 20 ({len(s.design_p99s)} runs of {t.check_seconds:g} s: {runs} "
            "ms)")


def _cpu_busy(o: Outcome) -> str:
    return ", ".join(f"{name} {share:.0%}" for name, share in o.cpu_busy.items())


def _outcome(o: Outcome) -> str:
    refused = f", refused {o.refused / o.offered:.1%}" if o.refused and o.offered else ""
    return (f"p50 {ms(o.p50_s)}, p99 {ms(o.p99_s)}, GPU busy {o.utilisation:.0%}, "
            f"mean batch {o.mean_batch:.1f}{refused}")


def _envelope(s: Sizing) -> str:
    """The envelope's figures, where it meets the target (a run that misses it stops early)."""
    if s.envelope_at_target.stopped:
        return f"misses p99 {ms(s.target.p99_s)}"
    return _outcome(s.envelope_at_target)


def why(s: Sizing) -> str:
    """Why the answer differs from the back-of-envelope count."""
    t, extra = s.target, s.deployment.instances - s.envelope_instances
    if extra <= 0:
        return ("The envelope's count is enough here: the batches fill and the queue stays "
                "short at this load.")
    load = t.qps / s.cost.throughput(t.max_batch_limit, s.envelope_instances)
    verdict = ("miss the target" if s.envelope_at_target.stopped else "meet the p99 but leave "
               f"nothing to spare (p99 {ms(s.envelope_at_target.p99_s)})")
    return (f"Why {extra} more than the envelope: it counts full batches on fully busy GPUs "
            f"with no queue. At {t.qps:,.0f}/s its {s.envelope_instances} instances run at "
            f"{load:.0%} of their full-batch capacity and {verdict}: every burst queues. The p99 "
            "must also hold "
            f"at +{t.headroom:.0%} ({t.design_qps:,.0f}/s), and batches that leave on the timer "
            "or the adaptive flush run below full size, so they carry less per call."
            + _rounded(s))


def _rounded(s: Sizing) -> str:
    """Where the user fixed the layout: that it may round the count up."""
    if s.target.layout == Layout():
        return ""
    d = s.deployment
    replicas = f"{d.replicas} replica{'s' if d.replicas > 1 else ''}"
    return (f" And the count is laid out as {replicas} of {_instances(d.instances_per_replica)}, "
            "which may round it up.")


def sizing_json(s: Sizing, arrivals: str = "poisson", redis: RedisSizes | None = None
                ) -> dict[str, Any]:
    d = s.deployment
    plan = {
        "target": {"qps": s.target.qps, "p99_ms": s.target.p99_s * 1e3,
                   "headroom": s.target.headroom, "arrivals": arrivals},
        "cost": s.cost.to_json(),
        "cpu": s.target.cpu.to_json() if s.target.cpu is not None else None,
        "deployment": {"gpu_instances": d.instances, "triton_replicas": d.replicas,
                       "instances_per_replica": d.instances_per_replica,
                       "inflight_budget": d.instances, "batchers": d.batchers,
                       "budget_riders": d.riders,
                       "partitions": s.partitions,
                       "gateways": s.gateways, "redis_shards": s.redis_shards,
                       "max_batch": d.max_batch,
                       "max_wait_ms": d.max_wait_s * 1e3, "overhead_ms": d.overhead_s * 1e3,
                       "max_backlog": d.max_backlog},
        "at_target": outcome_json(s.at_target),
        "at_design_load": outcome_json(s.at_design),
        "headroom": {"runs": len(s.design_p99s), "seconds": s.target.check_seconds,
                     "p99_ms": [p99 * 1e3 for p99 in s.design_p99s],
                     "p99_bound_ms": s.design_bound_s * 1e3},
        "capacity_per_s": s.capacity,
        "envelope": {"gpu_instances": s.envelope_instances,
                     "at_target": outcome_json(s.envelope_at_target)},
        "simulated_configurations": s.candidates,
    }
    if redis is not None:
        plan["redis_memory"] = memory_json(s, redis)
    return plan


def memory_json(s: Sizing, sizes: RedisSizes) -> dict[str, Any]:
    load, design = redis_loads(s, sizes)
    memory = redis_memory(load)
    return {"bytes": memory.total, "fixed_bytes": memory.fixed,
            "unfinished_bytes": memory.unfinished, "results_bytes": memory.results,
            "cache_bytes": memory.cache, "unfinished_tasks": load.unfinished,
            "kept_results": load.kept_results, "cache_entries": load.cache_entries,
            **asdict(sizes),
            "maxmemory_bytes": maxmemory(design, s.redis_shards),
            "maxmemory_per": "master" if s.redis_shards > 1 else "server"}


def outcome_json(o: Outcome) -> dict[str, Any]:
    return {"p50_ms": o.p50_s * 1e3, "p90_ms": o.p90_s * 1e3, "p99_ms": o.p99_s * 1e3,
            "p999_ms": o.p999_s * 1e3, "mean_ms": o.mean_s * 1e3, "gpu_busy": o.utilisation,
            "mean_batch": o.mean_batch, "served": o.served, "refused": o.refused,
            "stopped": o.stopped,
            "flushes": o.flushes, "cpu_busy": o.cpu_busy}


# -- curve --------------------------------------------------------------------------------------

def parse_configs(text: str) -> list[Deployment]:
    """``2x64x50`` = 2 instances, max batch 64, max wait 50 ms."""
    out = []
    for item in text.split(","):
        try:
            instances, batch, wait = item.strip().lower().split("x")
            out.append(Deployment(int(instances), int(batch), float(wait) / 1e3))
        except ValueError as exc:
            raise ConfigError(f"--configs item {item!r} is not INSTANCESxBATCHxWAIT_MS") from exc
    return out


def curve_points(cost: CostModel, deployment: Deployment, make: Arrivals, *, points: int,
                 seconds: float, seed: int) -> list[tuple[float, Outcome]]:
    """p99 at loads from 10% to 105% of the deployment's full-batch capacity."""
    capacity = cost.throughput(deployment.max_batch, deployment.instances)
    loads = [capacity * (0.1 + 0.95 * i / max(1, points - 1)) for i in range(points)]
    return [(qps, simulate(cost, deployment, make(qps, seconds, seed), seed=seed))
            for qps in loads]


def _curve(args: argparse.Namespace) -> int:
    import matplotlib  # noqa: PLC0415 - optional (ferry[plan]): only this command draws

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    cost, make = cost_of(args), arrivals_of(args)
    figure, axes = pyplot.subplots(figsize=(8, 5))
    dump: list[dict[str, Any]] = []
    for given in parse_configs(args.configs):
        config = Deployment(given.instances, given.max_batch, given.max_wait_s,
                            overhead_s=overhead_of(args, None))
        series = curve_points(cost, config, make, points=args.points, seconds=args.seconds,
                              seed=args.seed)
        label = (f"{config.instances} instance{'s' if config.instances > 1 else ''}, batch "
                 f"{config.max_batch}, wait {config.max_wait_s * 1e3:g} ms")
        axes.plot([q for q, _ in series], [o.p99_s * 1e3 for _, o in series], marker="o",
                  label=label)
        dump.append({"config": label, "points": [{"qps": q, **outcome_json(o)}
                                                 for q, o in series]})
    if args.p99_ms:
        axes.axhline(args.p99_ms, color="grey", linestyle="--", label=f"p99 {args.p99_ms:g} ms")
    axes.set_xlabel("offered load (requests/s)")
    axes.set_ylabel("predicted p99 (ms)")
    axes.set_yscale("log")
    axes.set_title(f"Ferry's operating curve: t(B) = {cost.fixed_s * 1e3:g} + "
                   f"{cost.per_item_s * 1e3:g}·B ms, {args.arrivals} arrivals")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    pyplot.close(figure)
    print(f"wrote {args.out}")
    if args.json:
        print(json.dumps(dump, indent=2))
    return 0

