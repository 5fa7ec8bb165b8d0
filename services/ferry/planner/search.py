"""Sizing: the cheapest deployment (fewest GPU instances) whose simulated p99 meets the target at
the target load plus headroom, over a small grid of batching settings.

Gateway processes, batchers and Redis shards are sized by CPU: with Ferry's measured CPU costs
(``ferry.planner.cpu``, from ``make bench``) so that none is planned busier than 60% at the design
load, and every candidate is simulated with them as servers; without, by a fixed number of
tasks per second per process. Partitions so that every batcher owns at least one. Then, for each
(max batch, max wait), a binary search over instance counts from the back-of-envelope bound
upward (p99 falls as instances are added), each candidate simulated with Ferry's own policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ferry.errors import ConfigError
from ferry.planner.costs import CostModel
from ferry.planner.cpu import CpuCost
from ferry.planner.simulate import Deployment, Outcome, simulate

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


def size(cost: CostModel, target: Target, arrivals: Arrivals,
         progress: Callable[[str], None] = lambda line: None) -> Sizing:
    """The cheapest deployment meeting ``target``; raises ConfigError if none up to
    ``max_instances`` does."""
    if target.qps <= 0 or target.p99_s <= 0:
        raise ConfigError("the target needs a positive QPS and p99")
    batchers, gateways, shards = _processes(target)
    base = Deployment(instances=1, batchers=batchers, overhead_s=target.overhead_s,
                      cpu=target.cpu, gateways=gateways, redis_shards=shards)
    best, tried = _search(cost, target, arrivals(target.design_qps, target.search_seconds,
                                                 target.seed), base, progress)
    chosen, at_design, checks = _confirmed(cost, best, target, arrivals)
    at_target = simulate(cost, chosen, arrivals(target.qps, target.check_seconds,
                                                target.seed + 1), seed=target.seed + 1)
    tried += checks
    plain = envelope(cost, target.qps, target.max_batch_limit)
    naive = _with_instances(replace(chosen, max_batch=target.max_batch_limit), plain, cost,
                            target)
    envelope_run = simulate(cost, naive, arrivals(target.qps, target.check_seconds,
                                                  target.seed + 1), seed=target.seed + 1)
    return Sizing(target=target, cost=cost, deployment=chosen, gateways=gateways,
                  partitions=partitions_for(batchers), redis_shards=shards, at_target=at_target,
                  at_design=at_design, envelope_instances=plain,
                  envelope_at_target=envelope_run, candidates=tried + 3)


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
            progress: Callable[[str], None]) -> tuple[Deployment, int]:
    """Over the grid of (max batch, max wait): the deployment of fewest instances (then lowest
    p99) that meets the target on the search's run, and how many candidates were simulated."""
    best: tuple[int, float, Deployment] | None = None
    tried = 0
    for base in _candidates(target, cost, first):
        found, count = _fewest(cost, base, target, search_arrivals)
        tried += count
        if found is None:
            continue
        p99 = found[1].p99_s
        slo = f", SLO {base.slo_s * 1e3:.0f} ms" if base.slo_s else ""
        progress(f"max batch {base.max_batch}, max wait {base.max_wait_s * 1e3:.0f} ms{slo}: "
                 f"{found[0].instances} instances (p99 {p99 * 1e3:.0f} ms)")
        key = (found[0].instances, p99)
        if best is None or key < best[:2]:
            best = (found[0].instances, p99, found[0])
    if best is None:
        raise ConfigError(f"no deployment of up to {target.max_instances} instances meets p99 "
                          f"{target.p99_s * 1e3:.0f} ms at {target.design_qps:,.0f}/s")
    return best[2], tried


def _candidates(target: Target, cost: CostModel, first: Deployment) -> list[Deployment]:
    """The grid: each max batch (whose full batch fits the budget) and max wait, without and
    with the SLO policy told the target (``FERRY_SLO_MS``: the p99 less Ferry's overhead)."""
    slo_s = target.p99_s - target.overhead_s
    return [replace(first, max_batch=max_batch, max_wait_s=wait_s, slo_s=slo)
            for max_batch in sorted({min(b, target.max_batch_limit) for b in target.batch_choices})
            if cost.time(max_batch) < target.p99_s
            for wait_s in target.wait_choices_s
            for slo in ((0.0, slo_s) if slo_s > 0 else (0.0,))]


def _confirmed(cost: CostModel, chosen: Deployment, target: Target, arrivals: Arrivals
               ) -> tuple[Deployment, Outcome, int]:
    """The search's answer checked on a longer run with other arrivals (bursts the search's
    shorter run did not meet show here), grown by 5% at a time until the check holds."""
    design = arrivals(target.design_qps, target.check_seconds, target.seed + 2)
    runs = 0
    while True:
        runs += 1
        outcome = simulate(cost, chosen, design, seed=target.seed + 2)
        if _meets(outcome, target):
            return chosen, outcome, runs
        if chosen.instances >= target.max_instances:
            raise ConfigError(f"no deployment of up to {target.max_instances} instances meets "
                              f"p99 {target.p99_s * 1e3:.0f} ms at {target.design_qps:,.0f}/s")
        grown = min(target.max_instances, chosen.instances + max(1, chosen.instances // 20))
        chosen = _with_instances(chosen, grown, cost, target)


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


def _fewest(cost: CostModel, base: Deployment, target: Target,
            arrivals: Sequence[float]) -> tuple[tuple[Deployment, Outcome] | None, int]:
    """The fewest instances meeting the p99 with these settings (binary search upward from the
    capacity bound), and how many runs it took."""
    low = envelope(cost, target.design_qps, base.max_batch)
    runs = 0

    def meets(instances: int) -> tuple[bool, Deployment, Outcome]:
        nonlocal runs
        runs += 1
        deployment = _with_instances(base, instances, cost, target)
        outcome = simulate(cost, deployment, arrivals, seed=target.seed)
        return _meets(outcome, target), deployment, outcome

    high, found = low, meets(low)
    while not found[0]:
        if high >= target.max_instances:
            return None, runs
        low, high = high + 1, min(target.max_instances, high * 2)
        found = meets(high)
    best = found
    while low < high:
        middle = (low + high) // 2
        attempt = meets(middle)
        if attempt[0]:
            high, best = middle, attempt
        else:
            low = middle + 1
    return (best[1], best[2]), runs


def _meets(outcome: Outcome, target: Target) -> bool:
    """The p99 holds, and admission refused (almost) nothing. (A deployment that cannot keep up
    fails one or the other: its queue grows until the backlog limit refuses arrivals, or, with
    no limit, its tail grows for the whole run.)"""
    refused = outcome.refused / outcome.offered if outcome.offered else 0.0
    return (outcome.served > 0 and outcome.p99_s <= target.p99_s
            and refused <= target.max_refused)
