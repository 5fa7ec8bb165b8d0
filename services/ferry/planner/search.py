"""Sizing: the cheapest deployment (fewest GPU instances) whose simulated p99 meets the target at
the target load plus headroom, over a small grid of batching settings, on several runs.

The instances are Triton's model instances over all its replicas: the in-flight budget the
batchers share (``ferry.planner.simulate``). A count is laid out on replicas, as many instances on
each, by the target's ``Layout`` (the fewest replicas of at most so many instances, or the
replicas or instances per replica fixed); every candidate is simulated as laid out.

Gateway processes, batchers and Redis shards are sized by CPU: with Ferry's measured CPU costs
(``ferry.planner.cpu``, from ``make bench``) so that none is planned busier than 60% at the design
load, and every candidate is simulated with them as servers; without, by a fixed number of
tasks per second per process. Partitions so that every batcher owns at least one. Then, for each
(max batch, max wait), a search over instance counts from the back-of-envelope bound upward
(p99 falls as instances are added), each candidate simulated with Ferry's own policy on one
run. The answer is then run at the design load on ``headroom_runs`` arrivals (the
search's run among them), and holds if the p99 they promise (``ferry.planner.headroom``: the
bound one more run would stay under 19 times in 20) meets the target; else the first of its
growths by 5% that holds does.

What makes it quick without changing its answer (where, as the search takes it, more instances
never break what fewer held): the counts are searched up from the bound in steps that double
from 5% of it, then halving the last (the answer is most often a few past the bound); the grid
is searched from its lowest capacity bound up, and no point is searched past the fewest
instances found so far (nor at all when its bound is above them: it cannot win); at the fewest
found, a point's run stops once its p99 is past the best's (it can no longer win); a point told
the SLO is not run where the same point without it found that the SLO would change none of the
batchers' decisions (the runs would be the same), nor is a deployment run twice on the same
arrivals (two counts may be laid out alike); the growths are searched by doubling, then
halving; and a run that can no longer meet the target (1% of its tasks late, or its refusals
past the share allowed), or whose p99 is past what the headroom's bound allows, stops there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ferry.errors import ConfigError
from ferry.planner.costs import CostModel
from ferry.planner.cpu import CpuCost
from ferry.planner.deployment import Bound, Deployment, Outcome
from ferry.planner.headroom import check_runs, largest_next, p99_bound
from ferry.planner.layout import Layout
from ferry.planner.simulate import simulate

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
    check_seconds: float = 20.0  # ... per run after the search: the headroom's and the figures'
    headroom_runs: int = 3  # runs at the design load, each on other arrivals, the answer holds
    seed: int = 0
    max_instances: int = 4096
    cpu: CpuCost | None = None  # Ferry's CPU costs (None: processes sized by tasks per second)
    layout: Layout = field(default_factory=Layout)  # how instances are laid out on replicas
    riders: bool = True  # several batchers share the budget as one queue (FERRY_BUDGET_RIDERS);
    # False: first come, first served

    @property
    def design_qps(self) -> float:
        return self.qps * (1.0 + self.headroom)

    @property
    def bound(self) -> Bound:
        """What a run must hold: a run that breaks it stops early (only whether it holds
        matters to the search)."""
        return Bound(p99_s=self.p99_s, refused=self.max_refused)

    @property
    def most_instances(self) -> int:
        """The most instances a deployment may have: ``max_instances``, or fewer where the
        layout fixes the replicas and bounds the instances on each."""
        return self.layout.most(self.max_instances)

    def none_meets(self, runs: str = "") -> ConfigError:
        """The error of a search that found nothing up to ``most_instances``."""
        return ConfigError(f"no deployment of up to {self.most_instances} instances"
                           f"{self.layout.describe()} meets p99 {self.p99_s * 1e3:.0f} ms at "
                           f"{self.design_qps:,.0f}/s{runs}")


@dataclass(frozen=True)
class Sizing:
    target: Target
    cost: CostModel
    deployment: Deployment
    gateways: int
    partitions: int
    redis_shards: int
    at_target: Outcome
    at_design: Outcome  # the headroom's run of the highest p99
    design_p99s: tuple[float, ...]  # each headroom run's p99
    envelope_instances: int
    envelope_at_target: Outcome  # stopped early where the envelope misses the target
    candidates: int  # configurations simulated

    @property
    def capacity(self) -> float:
        """Tasks per second at full batches on every instance."""
        return self.cost.throughput(self.deployment.max_batch, self.deployment.instances)

    @property
    def design_bound_s(self) -> float:
        """The p99 promised at the design load: one more run's, 19 times in 20."""
        return p99_bound(self.design_p99s)


def envelope(cost: CostModel, qps: float, max_batch: int) -> int:
    """The back-of-envelope count: full batches, no queueing, no headroom."""
    return max(1, math.ceil(qps / cost.throughput(max_batch)))


def processes(qps: float, per_process: float) -> int:
    return max(1, math.ceil(qps / per_process))


def partitions_for(batchers: int) -> int:
    """At least 16, and a power of two at least the batcher count (each owns one or more)."""
    return max(MIN_PARTITIONS, 1 << max(0, batchers - 1).bit_length())


Stage = Literal["searching", "checking", "figures"]  # the grid's search, the headroom's runs
# at the design load, the answer's and the envelope's at the target load


@dataclass(frozen=True)
class Progress:
    """Where a sizing stands, told as each simulated run starts (for a progress line)."""

    run: int  # the configuration being simulated: 1 for the first
    expected: int  # an estimate of how many it will simulate in all
    best: Deployment | None  # the fewest instances that met the target so far (checking: the
    # count being checked; figures: the answer)
    stage: Stage


class _Runs:
    """Simulates for the sizing, counting the runs and telling ``progress`` as each starts."""

    FIGURES = 2  # runs for the figures, after the headroom's: the answer's and the envelope's
    # at the target load

    def __init__(self, cost: CostModel, target: Target,
                 progress: Callable[[Progress], None]) -> None:
        self.cost = cost
        self.progress = progress
        self.count = 0
        self.after_search = target.headroom_runs - 1 + self.FIGURES  # runs after the search
        self.more = self.after_search  # runs still expected
        self.best: Deployment | None = None
        self.stage: Stage = "searching"
        # Runs made, and those that telling the batchers an SLO would not have changed (as the
        # deployment told it): by the deployment, the seed and the arrivals' id (the list is
        # kept, so that no other takes its id)
        self.made: dict[tuple[Deployment, int, int],
                        tuple[Outcome, Bound, Sequence[float]]] = {}

    def simulate(self, deployment: Deployment, arrivals: Sequence[float], seed: int,
                 bound: Bound | None = None, shadow_slo_s: float = 0.0) -> Outcome:
        """The run, or the same one made already (see ``_same_run``). ``shadow_slo_s``: an SLO
        whose run, if it would be this one, need not be made."""
        bound = bound or Bound()
        if (same := self._same_run(deployment, arrivals, seed, bound)) is not None:
            return same
        self.count += 1
        self.more = max(1, self.more)  # this one at least
        self.progress(Progress(self.count, self.count - 1 + self.more, self.best, self.stage))
        self.more -= 1
        outcome = simulate(self.cost, deployment, arrivals, seed=seed, bound=bound,
                           shadow_slo_s=shadow_slo_s)
        self.made[(deployment, seed, id(arrivals))] = (outcome, bound, arrivals)
        if shadow_slo_s and not outcome.slo_changes:
            told = replace(deployment, slo_s=shadow_slo_s)
            self.made[(told, seed, id(arrivals))] = (outcome, bound, arrivals)
        return outcome

    def _same_run(self, deployment: Deployment, arrivals: Sequence[float], seed: int,
                  bound: Bound) -> Outcome | None:
        """The run made already of ``deployment`` on the same arrivals (a layout may give two
        counts the same deployment), or of it without its SLO where that SLO changed none of
        its batchers' decisions, where it tells this run's verdict under ``bound``: it ran to
        the end (the verdict of a run stopped early is the whole run's), or stopped under a
        bound no looser."""
        if (key := (deployment, seed, id(arrivals))) not in self.made:
            return None
        outcome, made, _ = self.made[key]
        if outcome.stopped and (bound.p99_s > made.p99_s or bound.refused > made.refused):
            return None
        return outcome


def size(cost: CostModel, target: Target, arrivals: Arrivals,
         progress: Callable[[Progress], None] = lambda _: None) -> Sizing:
    """The cheapest deployment meeting ``target``; raises ConfigError if none up to
    ``max_instances`` does. ``progress`` is told where it stands as each simulated run
    starts."""
    if target.qps <= 0 or target.p99_s <= 0:
        raise ConfigError("the target needs a positive QPS and p99")
    check_runs(target.headroom_runs)
    batchers, gateways, shards = _processes(target)
    base = Deployment(instances=1, batchers=batchers, overhead_s=target.overhead_s,
                      cpu=target.cpu, gateways=gateways, redis_shards=shards,
                      riders=target.riders)
    runs = _Runs(cost, target, progress)
    search_load = arrivals(target.design_qps, target.search_seconds, target.seed)
    best = _search(cost, target, search_load, base, runs)
    runs.stage, runs.more = "checking", runs.after_search
    chosen, at_design = _headroom(cost, best, target, _DesignLoads(target, arrivals, search_load),
                                  runs)
    runs.stage, runs.best, runs.more = "figures", chosen, _Runs.FIGURES
    seed = target.seed + target.headroom_runs  # arrivals none of the headroom's runs had
    load = arrivals(target.qps, target.check_seconds, seed)
    at_target = runs.simulate(chosen, load, seed)
    plain = envelope(cost, target.qps, target.max_batch_limit)
    naive = _with_instances(replace(chosen, max_batch=target.max_batch_limit), plain, cost,
                            target, Layout(replicas=1))  # the envelope's count, as it is
    envelope_run = runs.simulate(naive, load, seed, target.bound)  # to the end where it meets
    # the target: how far it misses does not matter
    return Sizing(target=target, cost=cost, deployment=chosen, gateways=gateways,
                  partitions=partitions_for(batchers), redis_shards=shards, at_target=at_target,
                  at_design=max(at_design, key=lambda o: o.p99_s),
                  design_p99s=tuple(o.p99_s for o in at_design), envelope_instances=plain,
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


@dataclass(frozen=True)
class _Found:
    """A grid point's fewest instances, and its run there."""

    deployment: Deployment
    outcome: Outcome
    index: int  # in the grid

    @property
    def key(self) -> tuple[int, float, int]:
        """What the search keeps the least of: instances, then p99, then place in the grid."""
        return self.deployment.instances, self.outcome.p99_s, self.index


def _search(cost: CostModel, target: Target, search_arrivals: list[float], first: Deployment,
            runs: _Runs) -> _Found:
    """Over the grid of (max batch, max wait): the deployment of fewest instances (then lowest
    p99, then first in the grid) that meets the target on the search's run.

    The grid is searched from its lowest capacity bound up, and each point only up to the
    fewest instances met so far: a point whose bound is above them cannot win, and is not
    simulated (with the design scenario's t(B), max batch 16 needs 60 instances at full
    batches, where 64 met the target with 38); on those fewest, a point's run stops once its
    p99 is past the best's; and a point told the SLO is not run where the point before it,
    the same without the SLO, found that the SLO changes none of its runs (``_Runs``)."""
    grid = _candidates(target, cost, first)
    bound = [envelope(cost, target.design_qps, point.max_batch) for point in grid]
    order = sorted(range(len(grid)), key=lambda i: (bound[i], i))
    best: _Found | None = None
    for place, index in enumerate(order):
        most = best.deployment.instances if best else target.most_instances
        if bound[index] > most:
            break  # and so are the bounds of the rest
        likely = min(most, bound[index])  # what this point finds, at best
        runs.more = (runs.after_search + 1 + _expected_runs(bound[index], most)
                     + sum(1 for i in order[place + 1:] if bound[i] <= likely))
        found = _fewest(cost, grid[index], target, search_arrivals, runs=runs, most=most,
                        beat=best.outcome.p99_s if best else None,
                        shadow_slo_s=_told_next(grid, index))
        if found is not None and (best is None or _Found(*found, index).key < best.key):
            best = _Found(*found, index)
            runs.best = best.deployment
    if best is None:
        raise target.none_meets()
    return best


def _told_next(grid: Sequence[Deployment], index: int) -> float:
    """The SLO the grid's next point is told, where it is this one told it (0: none)."""
    point, after = grid[index], grid[index + 1] if index + 1 < len(grid) else None
    if point.slo_s or after is None or replace(after, slo_s=0.0) != point:
        return 0.0
    return after.slo_s


def _expected_runs(low: int, most: int) -> int:
    """About how many runs a search from ``low`` up to at most ``most`` instances takes (taken
    as up to twice ``low``)."""
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


class _DesignLoads:
    """The headroom's arrivals at the design load, one list a seed, each made once (the
    search's own where as long)."""

    def __init__(self, target: Target, arrivals: Arrivals, search: list[float]) -> None:
        self.target = target
        self.make = arrivals
        self.searched = target.check_seconds == target.search_seconds  # the search's run is
        # the first of the headroom's
        self.loads = {target.seed: search} if self.searched else {}

    def __getitem__(self, seed: int) -> list[float]:
        if seed not in self.loads:
            self.loads[seed] = self.make(self.target.design_qps, self.target.check_seconds, seed)
        return self.loads[seed]


def _headroom(cost: CostModel, chosen: _Found, target: Target, loads: _DesignLoads,
              runs: _Runs) -> tuple[Deployment, list[Outcome]]:
    """The search's answer run at the design load on ``headroom_runs`` arrivals (its search's
    run counts where as long), else the first of its growths by 5% at a time whose runs do;
    its runs. They hold when the p99 they promise (``headroom.p99_bound``) meets the target.
    The growths are searched by doubling the step, then halving the gap (the run of a growth a
    step at a time, but where no growth holds, as when bursts outrun Ferry's processes, a
    dozen steps say so rather than a hundred)."""
    ladder = _growths(chosen.deployment.instances, target.most_instances)
    searched = [chosen.outcome] if loads.searched else []

    def check(step: int) -> tuple[Deployment, list[Outcome]] | None:
        grown = (_with_instances(chosen.deployment, ladder[step], cost, target) if step
                 else chosen.deployment)
        runs.best = grown
        held = _holds(grown, target, loads, runs, searched if step == 0 else [])
        return (grown, held) if held is not None else None

    failed, step = -1, 0
    while (found := check(step)) is None:
        if step == len(ladder) - 1:
            raise target.none_meets(f" on {target.headroom_runs} runs")
        failed, step = step, min(len(ladder) - 1, 2 * step + 1)
        runs.more = max(runs.more, target.headroom_runs * (1 + (step - failed).bit_length())
                        + _Runs.FIGURES)
    while step - failed > 1:
        middle = (failed + step) // 2
        if (holds := check(middle)) is None:
            failed = middle
        else:
            step, found = middle, holds
    return found


def _holds(deployment: Deployment, target: Target, loads: _DesignLoads, runs: _Runs,
           done: list[Outcome]) -> list[Outcome] | None:
    """The headroom's runs of ``deployment`` (after those ``done``), if the p99 they promise
    meets the target; None as soon as it cannot (each run stops once its p99 is past what the
    promise allows)."""
    held = list(done)
    for seed in range(target.seed + len(held), target.seed + target.headroom_runs):
        most = largest_next([o.p99_s for o in held], target.headroom_runs, target.p99_s)
        if most is None:
            return None
        outcome = runs.simulate(deployment, loads[seed], seed,
                                replace(target.bound, p99_s=most))
        if not _meets(outcome, target, most):
            return None
        held.append(outcome)
    return held if p99_bound([o.p99_s for o in held]) <= target.p99_s else None


def _growths(instances: int, most: int) -> list[int]:
    """``instances``, then each 5% (at least one) more than the last, up to ``most``."""
    ladder = [instances]
    while ladder[-1] < most:
        ladder.append(min(most, ladder[-1] + max(1, ladder[-1] // 20)))
    return ladder


def _with_instances(base: Deployment, instances: int, cost: CostModel, target: Target,
                    layout: Layout | None = None) -> Deployment:
    """``base`` on at least ``instances``, laid out on replicas as the target's layout (or
    ``layout``) says, its batchers sharing them all as the in-flight budget, and Ferry's
    automatic backlog limit: what the instances serve in ``max_queue_wait_s``."""
    replicas, each = (layout or target.layout).of(instances)
    backlog = 0
    if target.max_queue_wait_s > 0:
        rate = cost.throughput(base.max_batch, replicas * each)
        backlog = max(1, math.ceil(rate * target.max_queue_wait_s))
    return replace(base, instances=replicas * each, replicas=replicas, max_backlog=backlog)


def _fewest(cost: CostModel, base: Deployment, target: Target, arrivals: Sequence[float], *,
            runs: _Runs, most: int, beat: float | None = None, shadow_slo_s: float = 0.0
            ) -> tuple[Deployment, Outcome] | None:
    """The fewest instances, at most ``most``, meeting the p99 with these settings (up from the
    capacity bound in steps that double from 5% of it, then a binary search in the last step:
    the answer is most often a few instances past the bound, and a run of many more instances
    than that costs several of them); None if ``most`` do not. With ``beat`` (the p99 of
    the best so far, on ``most``), a run on ``most`` where no fewer are left to try stops once
    its p99 is past it: it cannot win. ``shadow_slo_s``: the SLO the grid's next point is
    told, for ``runs`` to know whether its runs would be these."""
    low = envelope(cost, target.design_qps, base.max_batch)

    def meets(instances: int, last: bool) -> tuple[bool, Deployment, Outcome]:
        deployment = _with_instances(base, instances, cost, target)
        p99_s = beat if last and beat is not None else target.p99_s
        outcome = runs.simulate(deployment, arrivals, target.seed,
                                replace(target.bound, p99_s=p99_s), shadow_slo_s)
        return _meets(outcome, target, p99_s), deployment, outcome

    high, found = low, meets(low, low == most)
    step = max(1, low // 20)
    while not found[0]:
        if high >= most:
            return None
        low, high = high + 1, min(most, high + step)
        step *= 2
        found = meets(high, low == high == most)
    best = found
    while low < high:
        middle = (low + high) // 2
        attempt = meets(middle, False)
        if attempt[0]:
            high, best = middle, attempt
        else:
            low = middle + 1
    return best[1], best[2]


def _meets(outcome: Outcome, target: Target, p99_s: float | None = None) -> bool:
    """The p99 holds (the target's, or ``p99_s``), and admission refused (almost) nothing. (A
    deployment that cannot keep up fails one or the other: its queue grows until the backlog
    limit refuses arrivals, or, with no limit, its tail grows for the whole run.)"""
    refused = outcome.refused / outcome.offered if outcome.offered else 0.0
    limit = target.p99_s if p99_s is None else min(p99_s, target.p99_s)
    return (not outcome.stopped and outcome.served > 0 and outcome.p99_s <= limit
            and refused <= target.max_refused)
