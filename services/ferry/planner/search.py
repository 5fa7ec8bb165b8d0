"""Sizing: the cheapest deployment (fewest GPU instances) whose simulated p99 meets the target at
the target load plus headroom, over a small grid of batching settings.

Gateway processes, batchers and Redis shards are sized by CPU: with Ferry's measured CPU costs
(``ferry.planner.cpu``, from ``make bench``) so that none is planned busier than 60% at the design
load, and every candidate is simulated with them as servers; without, by a fixed number of
tasks per second per process. Partitions so that every batcher owns at least one. Then, for each
(max batch, max wait), a binary search over instance counts from the back-of-envelope bound
upward (p99 falls as instances are added), each candidate simulated with Ferry's own policy.

What makes it quick without changing its answer (where, as the binary search takes it, more
instances never break what fewer held): the grid is searched from its lowest capacity bound up,
and no point is searched past the fewest instances found so far (nor at all when its bound is
above them: it cannot win); the growths of an answer its check breaks are searched by doubling,
then halving; and a run that can no longer meet the target (1% of its tasks late, or its
refusals past the share allowed) stops there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ferry.errors import ConfigError
from ferry.planner.costs import CostModel
from ferry.planner.cpu import CpuCost
from ferry.planner.simulate import Bound, Deployment, Outcome, simulate

Arrivals = Callable[[float, float, int], list[float]]  # (qps, seconds, seed) -> times

# One process of each, as measured by make bench on a 2-core machine where gateway, batcher,
# Redis and the load generator shared the cores: Ferry held p99 < 100 ms up to 2,000/s.
GATEWAY_TASKS_PER_S = 2000.0
BATCHER_TASKS_PER_S = 2000.0
MIN_PARTITIONS = 16


@dataclass(frozen=True)
class Target:
    qps: float
    p99_s: float
    headroom: float = 0.2  # the p99 must hold at qps · (1 + headroom)
    max_batch_limit: int = 64  # the model's max_batch_size
    batch_choices: tuple[int, ...] = (16, 32, 64)
    wait_choices_s: tuple[float, ...] = (0.01, 0.05)
    overhead_s: float = 0.003
    gateway_tasks_per_s: float = GATEWAY_TASKS_PER_S
    batcher_tasks_per_s: float = BATCHER_TASKS_PER_S
    max_queue_wait_s: float = 10.0  # Ferry's admission: backlog = capacity x this (0: none)
    max_refused: float = 0.001  # share of arrivals admission may refuse at the design load
    search_seconds: float = 20.0  # simulated time per candidate
    check_seconds: float = 60.0  # simulated time for the answer's figures
    seed: int = 0
    max_instances: int = 4096
    cpu: CpuCost | None = None  # Ferry's CPU costs (None: processes sized by tasks per second)

    @property
    def design_qps(self) -> float:
        return self.qps * (1.0 + self.headroom)

    @property
    def bound(self) -> Bound:
        """What a run must hold: a run that breaks it stops early (only whether it holds
        matters to the search)."""
        return Bound(p99_s=self.p99_s, refused=self.max_refused)


@dataclass(frozen=True)
class Sizing:
    target: Target
    cost: CostModel
    deployment: Deployment
    gateways: int
    partitions: int
    redis_shards: int
    at_target: Outcome
    at_design: Outcome
    envelope_instances: int
    envelope_at_target: Outcome
    candidates: int  # configurations simulated

    @property
    def capacity(self) -> float:
        """Tasks per second at full batches on every instance."""
        return self.cost.throughput(self.deployment.max_batch, self.deployment.instances)


def envelope(cost: CostModel, qps: float, max_batch: int) -> int:
    """The back-of-envelope count: full batches, no queueing, no headroom."""
    return max(1, math.ceil(qps / cost.throughput(max_batch)))


def processes(qps: float, per_process: float) -> int:
    return max(1, math.ceil(qps / per_process))


def partitions_for(batchers: int) -> int:
    """At least 16, and a power of two at least the batcher count (each owns one or more)."""
    return max(MIN_PARTITIONS, 1 << max(0, batchers - 1).bit_length())


@dataclass(frozen=True)
class Progress:
    """Where a sizing stands, told as each simulated run starts (for a progress line)."""

    run: int  # the configuration being simulated: 1 for the first
    expected: int  # an estimate of how many it will simulate in all
    best: Deployment | None  # the fewest instances that met the target so far
    checking: bool  # the search is over: the answer is being checked on longer runs


class _Runs:
    """Simulates for the sizing, counting the runs and telling ``progress`` as each starts."""

    CHECKS = 3  # runs after the search: the answer at the design load and the target's, the
    # envelope's at the target's

    def __init__(self, cost: CostModel, progress: Callable[[Progress], None]) -> None:
        self.cost = cost
        self.progress = progress
        self.count = 0
        self.more = self.CHECKS  # runs still expected
        self.best: Deployment | None = None
        self.checking = False

    def simulate(self, deployment: Deployment, arrivals: Sequence[float], seed: int,
                 bound: Bound | None = None) -> Outcome:
        self.count += 1
        self.more = max(1, self.more)  # this one at least
        self.progress(Progress(self.count, self.count - 1 + self.more, self.best,
                               self.checking))
        self.more -= 1
        return simulate(self.cost, deployment, arrivals, seed=seed, bound=bound)


def size(cost: CostModel, target: Target, arrivals: Arrivals,
         progress: Callable[[Progress], None] = lambda _: None) -> Sizing:
    """The cheapest deployment meeting ``target``; raises ConfigError if none up to
    ``max_instances`` does. ``progress`` is told where it stands as each simulated run
    starts."""
    if target.qps <= 0 or target.p99_s <= 0:
        raise ConfigError("the target needs a positive QPS and p99")
    batchers, gateways, shards = _processes(target)
    base = Deployment(instances=1, batchers=batchers, overhead_s=target.overhead_s,
                      cpu=target.cpu, gateways=gateways, redis_shards=shards)
    runs = _Runs(cost, progress)
    best = _search(cost, target, arrivals(target.design_qps, target.search_seconds,
                                          target.seed), base, runs)
    runs.checking, runs.more = True, _Runs.CHECKS
    chosen, at_design = _confirmed(cost, best, target, arrivals, runs)
    load = arrivals(target.qps, target.check_seconds, target.seed + 1)
    at_target = runs.simulate(chosen, load, target.seed + 1)
    plain = envelope(cost, target.qps, target.max_batch_limit)
    naive = _with_instances(replace(chosen, max_batch=target.max_batch_limit), plain, cost,
                            target)
    envelope_run = runs.simulate(naive, load, target.seed + 1)
    return Sizing(target=target, cost=cost, deployment=chosen, gateways=gateways,
                  partitions=partitions_for(batchers), redis_shards=shards, at_target=at_target,
                  at_design=at_design, envelope_instances=plain,
                  envelope_at_target=envelope_run, candidates=runs.count)


def _processes(target: Target) -> tuple[int, int, int]:
    """Batchers, gateway processes and Redis shards for the design load: by CPU cost at batches
    half the model's largest (a conservative mean under load), or by tasks per second."""
    if target.cpu is None:
        return (processes(target.design_qps, target.batcher_tasks_per_s),
                processes(target.design_qps, target.gateway_tasks_per_s), 1)
    cpu, qps, half = target.cpu, target.design_qps, target.max_batch_limit / 2
    return (cpu.processes("batcher", qps, half), cpu.processes("gateway", qps, half),
            cpu.processes("redis", qps, half))


def _search(cost: CostModel, target: Target, search_arrivals: list[float], first: Deployment,
            runs: _Runs) -> Deployment:
    """Over the grid of (max batch, max wait): the deployment of fewest instances (then lowest
    p99, then first in the grid) that meets the target on the search's run.

    The grid is searched from its lowest capacity bound up, and each point only up to the
    fewest instances met so far: a point whose bound is above them cannot win, and is not
    simulated (with the design scenario's t(B), max batch 16 needs 60 instances at full
    batches, where 64 met the target with 38)."""
    grid = _candidates(target, cost, first)
    bound = [envelope(cost, target.design_qps, point.max_batch) for point in grid]
    order = sorted(range(len(grid)), key=lambda i: (bound[i], i))
    best: tuple[int, float, int, Deployment] | None = None
    for place, index in enumerate(order):
        most = best[0] if best else target.max_instances
        if bound[index] > most:
            break  # and so are the bounds of the rest
        likely = min(most, bound[index])  # what this point finds, at best
        runs.more = (_Runs.CHECKS + _expected_runs(bound[index], most)
                     + sum(1 for i in order[place + 1:] if bound[i] <= likely))
        found = _fewest(cost, grid[index], target, search_arrivals, runs=runs, most=most)
        if found is None:
            continue
        key = (found[0].instances, found[1].p99_s, index)
        if best is None or key < best[:3]:
            best = (*key, found[0])
            runs.best = found[0]
    if best is None:
        raise ConfigError(f"no deployment of up to {target.max_instances} instances meets p99 "
                          f"{target.p99_s * 1e3:.0f} ms at {target.design_qps:,.0f}/s")
    return best[3]


def _expected_runs(low: int, most: int) -> int:
    """About how many runs a binary search from ``low`` up to at most ``most`` instances takes
    (taken as up to twice ``low``)."""
    span = min(most, 2 * low) - low + 1
    return 1 + max(0, span - 1).bit_length()


def _candidates(target: Target, cost: CostModel, first: Deployment) -> list[Deployment]:
    """The grid: each max batch (whose full batch fits the budget) and max wait, without and
    with the SLO policy told the target (``FERRY_SLO_MS``: the p99 less Ferry's overhead)."""
    slo_s = target.p99_s - target.overhead_s
    return [replace(first, max_batch=max_batch, max_wait_s=wait_s, slo_s=slo)
            for max_batch in sorted({min(b, target.max_batch_limit) for b in target.batch_choices})
            if cost.time(max_batch) < target.p99_s
            for wait_s in target.wait_choices_s
            for slo in ((0.0, slo_s) if slo_s > 0 else (0.0,))]


def _confirmed(cost: CostModel, chosen: Deployment, target: Target, arrivals: Arrivals,
               runs: _Runs) -> tuple[Deployment, Outcome]:
    """The search's answer checked on a longer run with other arrivals (bursts the search's
    shorter run did not meet show here), else the first of its growths by 5% at a time that
    holds the check. Those are searched by doubling the step, then halving the gap (the run of
    a growth a step at a time, but where no growth holds, as when bursts outrun Ferry's
    processes, a dozen runs say so rather than a hundred)."""
    design = arrivals(target.design_qps, target.check_seconds, target.seed + 2)
    ladder = _growths(chosen.instances, target.max_instances)

    def check(step: int) -> tuple[Deployment, Outcome] | None:
        grown = _with_instances(chosen, ladder[step], cost, target) if step else chosen
        runs.best = grown
        outcome = runs.simulate(grown, design, target.seed + 2, target.bound)
        return (grown, outcome) if _meets(outcome, target) else None

    failed, step = -1, 0
    while (found := check(step)) is None:
        if step == len(ladder) - 1:
            raise ConfigError(f"no deployment of up to {target.max_instances} instances meets "
                              f"p99 {target.p99_s * 1e3:.0f} ms at {target.design_qps:,.0f}/s")
        failed, step = step, min(len(ladder) - 1, 2 * step + 1)
        runs.more = max(runs.more, 3 + (step - failed).bit_length())
    while step - failed > 1:
        middle = (failed + step) // 2
        if (holds := check(middle)) is None:
            failed = middle
        else:
            step, found = middle, holds
    return found


def _growths(instances: int, most: int) -> list[int]:
    """``instances``, then each 5% (at least one) more than the last, up to ``most``."""
    ladder = [instances]
    while ladder[-1] < most:
        ladder.append(min(most, ladder[-1] + max(1, ladder[-1] // 20)))
    return ladder


def _with_instances(base: Deployment, instances: int, cost: CostModel,
                    target: Target) -> Deployment:
    """``base`` on ``instances``, each batcher allowed its share of them in flight (Ferry's
    default, every instance per batcher, lets batchers stack small batches at Triton), and
    Ferry's automatic backlog limit: what the instances serve in ``max_queue_wait_s``."""
    backlog = 0
    if target.max_queue_wait_s > 0:
        rate = cost.throughput(base.max_batch, instances)
        backlog = max(1, math.ceil(rate * target.max_queue_wait_s))
    return replace(base, instances=instances, max_backlog=backlog,
                   inflight=max(1, math.ceil(instances / base.batchers)))


def _fewest(cost: CostModel, base: Deployment, target: Target, arrivals: Sequence[float], *,
            runs: _Runs, most: int) -> tuple[Deployment, Outcome] | None:
    """The fewest instances, at most ``most``, meeting the p99 with these settings (binary
    search upward from the capacity bound); None if ``most`` do not."""
    low = envelope(cost, target.design_qps, base.max_batch)

    def meets(instances: int) -> tuple[bool, Deployment, Outcome]:
        deployment = _with_instances(base, instances, cost, target)
        outcome = runs.simulate(deployment, arrivals, target.seed, target.bound)
        return _meets(outcome, target), deployment, outcome

    high, found = low, meets(low)
    while not found[0]:
        if high >= most:
            return None
        low, high = high + 1, min(most, high * 2)
        found = meets(high)
    best = found
    while low < high:
        middle = (low + high) // 2
        attempt = meets(middle)
        if attempt[0]:
            high, best = middle, attempt
        else:
            low = middle + 1
    return best[1], best[2]


def _meets(outcome: Outcome, target: Target) -> bool:
    """The p99 holds, and admission refused (almost) nothing. (A deployment that cannot keep up
    fails one or the other: its queue grows until the backlog limit refuses arrivals, or, with
    no limit, its tail grows for the whole run.)"""
    refused = outcome.refused / outcome.offered if outcome.offered else 0.0
    return (not outcome.stopped and outcome.served > 0 and outcome.p99_s <= target.p99_s
            and refused <= target.max_refused)
