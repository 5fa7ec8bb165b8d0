"""A discrete-event simulation of a Ferry deployment, driven by the code the batcher runs.

Each simulated batcher keeps what the real one keeps for a model (``ferry.batcher.worker``): a
boarding queue, the arrival rate (``ArrivalRate``), the fitted t(B) of the calls it made
(``BatchCost``), and the window of batches it may have at Triton (``Window``, AIMD on slow calls,
at most ``inflight``, or the whole budget). It asks ``BatchPolicy.plan`` (the same object, fed the
simulated clock) what leaves, whenever a request boards, a batch returns, or the plan asked to
look again. Requests are spread over batchers at random, as partitions spread them.

The batchers share the model's in-flight budget, as Ferry's do (``FERRY_INFLIGHT_BUDGET``): the
instances over all Triton replicas (times ``FERRY_BATCHES_PER_INSTANCE``) are as many slots,
each a batch at Triton at once, whichever batcher sent it (``ferry.planner.fleet``). With riders
(``FERRY_BUDGET_RIDERS``, on), as one queue: a slot taken anywhere takes the oldest tasks of the
batchers that hold none along, and leaves at once; a slot stays with its batcher while it has
work, its batch taking the others' offers while it runs (``_plan_fleet``, ``_pull``). Without
(``riders=False``), first come, first served: a batcher with a batch ready (full, or due) and no
free slot waits for one; a slot that frees goes to the batcher that has waited longest, which
then sends what it holds, up to the max batch (the batch forms when its slot is granted). A
batch with a slot finds an idle instance (no replica runs more than its instances; past one
batch an instance, it waits at Triton), taking t(B) plus the fit's jitter; the simulation does
not tell the replicas apart. With one batcher the budget never holds it back (its window is at
most the budget), nor do riders change anything: the run is the one a batcher that owns the
instances makes. Without a shared budget (``shared_budget=False``:
``FERRY_INFLIGHT_BUDGET=local``, and every Ferry before the budget was shared), each batcher has
its own window of the instances, and batches past the instances queue at Triton, FIFO.

Admission: above ``max_backlog`` unfinished tasks, arrivals are refused (429), as the gateway
does. A task's latency is its time to its result, plus ``overhead_s`` (Ferry's own hops: gateway,
Redis, wake-up).

With a ``CpuCost`` (``Deployment.cpu``), Ferry's processes are servers too, each doing one thing
at a time: a task is admitted by a gateway worker and Redis and read by its batcher before it
boards; a batch leaves for Triton once its batcher has sent it, and is answered once its batcher
and Redis have settled it and each task's gateway worker has answered it. So a deployment
saturates by CPU as well as by GPU, and the batcher's work between two calls delays the next.
Without one, that work is a fixed ``overhead_s`` per task.

A run given a ``Bound`` (a sizing's p99 and refusals) stops as soon as it can no longer hold it:
the search needs only its verdict, and a deployment that cannot keep up says so early. A run
without an SLO may be given one to shadow (``shadow_slo_s``): it asks the policy each question
with that SLO too, and says whether any answer differed. Where none did, the run told that SLO
is the very same run, and need not be made.

What it leaves out: other processes on the same cores, network jitter, and priorities (one
lane). The batcher's read parking only delays reads until a batch could leave, which changes no
batch; it is not modelled. Nor is the time a slot takes to pass between batchers through Redis
(a round trip or two while the instance waits), nor its CPU: a hand-over is counted
(``Outcome.handovers``), not timed.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ferry.errors import ConfigError
from ferry.planner.costs import CostModel
from ferry.planner.cpu import CpuCost
from ferry.planner.deployment import Bound, Deployment, Outcome
from ferry.planner.fleet import PULL_EVERY_S, Batcher, Budget, take_riders
from ferry.planner.servers import Server
from ferry.rules.estimators import Window
from ferry.rules.policy import Backend, BatchPolicy, Lane, Plan, Waiting

LANE = Lane("model")
_DONE, _WAKE, _BOARD, _REACH, _PULL = 0, 1, 2, 3, 4
FORGET_EVERY = 256  # arrivals between two prunings of the servers' past work


class _Broken(Exception):
    """The run's bound can no longer hold."""


@dataclass(slots=True)
class _Batch:
    batcher: Batcher
    arrivals: list[float]
    sent_at: float
    workers: list[int] = field(default_factory=list)  # each task's gateway worker (with CPU)


_Boarding = tuple[Batcher, float, int]  # a task read by its batcher: when it arrived, and its
# gateway worker (a tuple: one is made a task)


class Simulation:
    """One run: ``Simulation(cost, deployment, seed).run(arrival_times)``."""

    def __init__(self, cost: CostModel, deployment: Deployment, seed: int = 0,
                 warmup_s: float | None = None, *, bound: Bound | None = None,
                 shadow_slo_s: float = 0.0) -> None:
        if shadow_slo_s and deployment.slo_s:
            raise ConfigError("a shadow SLO is for a run without one")
        self.cost = cost
        self.bound = bound or Bound()
        self.shadow_slo_s = shadow_slo_s
        self.slo_changes = False  # the shadow SLO changed an answer of the policy
        self.over = 0  # measured tasks answered later than the bound's p99
        self.doomed = 0  # ... read by their batcher already too late to be answered in time
        self.over_limit = math.inf  # ... as many as prove the p99 past it
        self.measured = 0  # arrivals after the warm-up
        self.deployment = deployment
        self.policy = BatchPolicy(deployment.max_batch, deployment.max_wait_s,
                                  adaptive=deployment.adaptive)
        self.rng = random.Random(seed)
        self.warmup_s = warmup_s
        self.batchers = [Batcher(i, Window(deployment.window))
                         for i in range(deployment.batchers)]
        self.budget = Budget(deployment.slots)
        self.fleet = deployment.fleet  # batchers whose work a slot's batch carries (riders)
        self.idle, self.at_triton = deployment.instances, deque[_Batch]()  # Triton: idle, queued
        self.events: list[tuple[float, int, int, _Batch | Batcher | _Boarding]] = []
        self.cpu = (deployment.cpu.scaled(deployment.slowdown)
                    if deployment.cpu is not None and deployment.slowdown != 1 else deployment.cpu)
        self.gateways = [Server() for _ in range(deployment.gateways if self.cpu else 0)]
        self.redis = [Server() for _ in range(deployment.redis_shards)]
        self._pick_batcher = _chooser(self.rng, len(self.batchers))
        self._pick_worker = _chooser(self.rng, max(1, len(self.gateways)))
        self._pick_shard = _chooser(self.rng, len(self.redis))
        # What the run reads for every task, looked up once
        self._warmup, self._late = warmup_s or 0.0, self.bound.p99_s
        self._backlog_limit = deployment.max_backlog or math.inf
        self._admit_s = _admission_work(self.cpu)
        self.seq = self.riders = 0  # events pushed; tasks that rode another batcher's batch
        self.latencies: list[float] = []
        self.flushes: Counter[str] = Counter()
        self.batch_sizes = self.batches = self.backlog = self.refused = self.offered = 0
        self.busy_s = self.last_answer = 0.0

    def run(self, arrivals: Sequence[float]) -> Outcome:
        """Simulate until every admitted task is answered; statistics skip the warm-up."""
        end = arrivals[-1] if arrivals else 0.0
        warmup = self.warmup_s if self.warmup_s is not None else 0.1 * end
        self.warmup_s = warmup
        self._limit(arrivals)
        self._warmup, self._late = warmup, self.bound.p99_s
        events, next_event, arrive = self.events, self._next_event, self._arrive
        unfinished = 0
        try:
            for first in range(0, len(arrivals), FORGET_EVERY):
                for now in arrivals[first:first + FORGET_EVERY]:
                    while events and events[0][0] <= now:
                        next_event()
                    arrive(now)
                self._forget(now)
            unfinished = self.backlog
            while self.events:
                self._next_event()
        except _Broken:
            return self._outcome(max(0.0, end - warmup), self.backlog, stopped=True)
        return self._outcome(max(0.0, end - warmup), unfinished)

    def _forget(self, now: float) -> None:
        """Every server drops what it finished before ``now``, the clock (an arrival's: every
        event still to come is later)."""
        for server in (*self.gateways, *self.redis, *(b.server for b in self.batchers)):
            server.forget(now)

    def _limit(self, arrivals: Sequence[float]) -> None:
        """How many late answers prove the p99 past the bound's, whatever the rest: the
        nearest-rank p99 of n answers is past it once n - ceil(0.99 n) + 1 of them are, a count
        that grows with n, so the count for every measured arrival served holds for fewer."""
        warmup = self.warmup_s or 0.0
        self.measured = sum(1 for at in arrivals if at >= warmup)
        if self.bound.p99_s < math.inf:
            self.over_limit = self.measured - math.ceil(0.99 * self.measured) + 1

    # -- events ---------------------------------------------------------------------------------

    def _arrive(self, now: float) -> None:
        measured = now >= self._warmup
        self.offered += measured
        if self.backlog >= self._backlog_limit:
            self.refused += measured
            if measured and self.refused / self.measured > self.bound.refused:
                raise _Broken
            return
        self.backlog += 1
        batcher = self.batchers[self._pick_batcher()]
        if self.cpu is None:
            self._board((batcher, now, 0), now)
            return
        gateway_s, redis_s, batcher_s = self._admit_s
        worker = self._pick_worker()  # connections spread over workers
        read = self.redis[self._pick_shard()].run(self.gateways[worker].run(now, gateway_s),
                                                  redis_s)
        boards = batcher.server.run(read, batcher_s)
        if measured and boards - now > self._late:
            # Its processes cannot keep up: such a task's answer would be counted late only
            # once the arrivals are all simulated.
            self.doomed += 1
            if self.doomed >= self.over_limit:
                raise _Broken
        self.seq += 1  # (self._push, without the call: once a task)
        heapq.heappush(self.events, (boards, self.seq, _BOARD, (batcher, now, worker)))

    def _board(self, boarding: _Boarding, now: float) -> None:
        """A task read by its batcher joins its queue."""
        batcher, arrival, worker = boarding
        batcher.queue.append(arrival)
        batcher.workers.append(worker)
        batcher.rate.add(now)
        self._plan(batcher, now)

    def _next_event(self) -> None:
        now, _, kind, item = heapq.heappop(self.events)
        if kind == _BOARD:  # the most frequent: one a task
            assert isinstance(item, tuple)
            self._board(item, now)
        elif kind == _DONE:
            assert isinstance(item, _Batch)
            self._done(item, now)
        elif kind == _REACH:
            assert isinstance(item, _Batch)
            self._reach(item, now)
        else:
            assert isinstance(item, Batcher)
            if kind == _PULL:
                self._pull(item, now)
            elif now >= item.wake_at:
                item.wake_at = math.inf
                self._plan(item, now)

    def _done(self, batch: _Batch, now: float) -> None:
        self.idle += 1
        if self.at_triton:
            self._start(self.at_triton.popleft(), now)
        batcher, size = batch.batcher, len(batch.arrivals)
        batcher.in_flight -= 1
        self.budget.in_flight -= 1
        seconds = now - batch.sent_at  # what the batcher sees: Triton's queue included
        batcher.window.observe(seconds, batcher.cost.time_at(size) if batcher.cost.settled
                               else 0.0)
        batcher.allowed = batcher.window.allowed
        batcher.cost.add(size, seconds)
        self.backlog -= size
        kept = self.fleet > 1 and bool(batcher.queue)
        if kept:  # riders: the slot stays, and its next batch leaves before this one's results
            self.budget.keep(batcher)  # are written (Ferry's freed slot makes way first)
            self._plan(batcher, now)
        self._answered(batch, now)
        if not kept:
            self._release(now)
        self._plan(batcher, now)

    def _answered(self, batch: _Batch, now: float) -> None:
        """The batch's tasks are answered: their latencies counted (the run stops once they
        prove its bound broken)."""
        warmup, late, latencies = self._warmup, self._late, self.latencies
        answers = self._answers(batch, now)
        self.last_answer = max(self.last_answer, *answers)
        for arrival, answered in zip(batch.arrivals, answers, strict=True):
            if arrival >= warmup:
                latencies.append(answered - arrival)
                if answered - arrival > late:
                    self.over += 1
        if self.over >= self.over_limit:
            raise _Broken

    def _shard(self) -> Server:
        """The Redis server of a task's partition (of a batch's, for its completion)."""
        return self.redis[self._pick_shard()]

    def _answers(self, batch: _Batch, now: float) -> list[float]:
        """When each task of a batch Triton finished at ``now`` is answered: its batcher and
        Redis settle the batch, then each task's gateway worker answers it."""
        overhead, size = self.deployment.overhead_s, len(batch.arrivals)
        if self.cpu is None:
            return [now + overhead] * size
        cpu = self.cpu
        batcher = batch.batcher
        batcher.batch_work_until = batcher.server.run(now, cpu.batcher_batch_s / 2
                                                      + size * cpu.batcher_task_s / 3)
        settled = self._shard().run(batcher.batch_work_until,
                                    cpu.redis_batch_s + size * cpu.redis_task_s / 2)
        answer_s = cpu.gateway_task_s / 2 + cpu.gateway_batch_s / size
        return [self.gateways[w].run(settled, answer_s) + overhead for w in batch.workers]

    # -- the batcher's decisions ----------------------------------------------------------------

    def _plan(self, batcher: Batcher, now: float) -> None:
        """Ask the policy, as the batcher's dispatcher does, while a batch may start."""
        until = batcher.batch_work_until
        if until > now:  # settling or sending a batch (one event loop): it looks once done
            if until < batcher.wake_at:  # (self._wake, without the call: once a task)
                self._wake(batcher, until)
            return
        if self.fleet > 1:
            self._plan_fleet(batcher, now)
            return
        own = batcher.allowed - batcher.in_flight
        if own <= 0 or not batcher.queue:
            self._give_back(batcher, now)
            return  # nothing can leave: the next return or arrival asks again
        free = min(own, self.budget.free(batcher))
        if not free and self._nothing_new(batcher, now):
            if not batcher.waiting:  # (the wake it asked for may have been spent sooner)
                self._wake(batcher, batcher.idle_until)
            return
        plan = self._ask(batcher, now, free)
        self._depart(batcher, plan, now)
        if plan.wake_in == 0 and len(plan.flush) == free < own:
            self.budget.wait(batcher)  # a batch is ready, the budget has no slot: it waits
        elif plan.wake_in is not None and plan.wake_in > 0:
            if not free:
                batcher.idle_until = now + plan.wake_in
            self._wake(batcher, now + plan.wake_in)
        self._give_back(batcher, now)

    def _depart(self, batcher: Batcher, plan: Plan, now: float) -> None:
        """Send the plan's batches."""
        queue = batcher.queue
        for departure in plan.flush:
            tasks = [queue.popleft() for _ in range(departure.size)]
            workers = [batcher.workers.popleft() for _ in range(departure.size)]
            self.flushes[departure.reason.value] += 1
            self._send(_Batch(batcher, tasks, now, workers), now)

    def _plan_fleet(self, batcher: Batcher, now: float) -> None:
        """As the batcher plans with the fleet's one queue (``ferry.planner.fleet``): a slot in
        its hand (kept, handed to it or taken) sends what it holds at once, riders included;
        without one, a batch that may leave, or under load any work while none of its batches
        runs, takes a spare slot with riders, or waits in line, its tasks offered meanwhile."""
        while batcher.queue and batcher.allowed > batcher.in_flight:
            if batcher.batch_work_until > now:  # sending the batch that just left
                self._wake(batcher, batcher.batch_work_until)
                return
            if not batcher.granted and not self._take_slot(batcher, now):
                return
            own = batcher.allowed - batcher.in_flight
            plan = self._ask(batcher, now, min(own, batcher.granted), taken=True)
            self._depart(batcher, plan, now)
            if not plan.flush:  # the policy holds it for company (an SLO): the slot goes back
                break
        self._give_back(batcher, now)

    def _take_slot(self, batcher: Batcher, now: float) -> bool:
        """Whether a batcher with no slot in hand took a spare one, with riders, for a batch
        that may leave, or, under load, for any work while none of its batches runs; else it
        waits in line for one, or looks again when the policy says."""
        free = min(batcher.allowed - batcher.in_flight, self.budget.spare)
        if not free and self._nothing_new(batcher, now):
            if not batcher.waiting:
                self._wake(batcher, batcher.idle_until)
            return False
        plan = self._ask(batcher, now, free)
        if plan.flush or plan.wake_in == 0 or (
                not batcher.in_flight and self.policy.loaded(
                    self.deployment.max_batch, self._backend(batcher, now, free))):
            if not free:
                self.budget.wait(batcher)
                return False
            self.budget.grab(batcher)
            self._ride(batcher)
            return True
        if plan.wake_in is not None:
            if not free:
                batcher.idle_until = now + plan.wake_in
            self._wake(batcher, now + plan.wake_in)
        return False

    def _ride(self, batcher: Batcher, *, pulled: bool = False) -> None:
        """A slot taken for ``batcher`` takes the others' oldest offers along, up to the max
        batch; a pull, those its next batch carries (``fleet.take_riders``)."""
        self.riders += take_riders(batcher, self.batchers, self.budget,
                                   self.deployment.max_batch, pulled=pulled)

    def _pull(self, batcher: Batcher, now: float) -> None:
        """While its batch runs, a batcher takes the others' offers, every ``PULL_EVERY_S``:
        its next batch, which leaves on the same slot, carries the fleet's oldest work."""
        batcher.pulling = False
        if batcher.offering:  # its slot went back: its own work is offered now
            return
        before = self.riders
        self._ride(batcher, pulled=True)
        self._pull_later(batcher, now)
        if self.riders > before:
            self._plan(batcher, now)

    def _pull_later(self, batcher: Batcher, now: float) -> None:
        if not batcher.pulling:
            batcher.pulling = True
            self._push(now + PULL_EVERY_S, _PULL, batcher)

    def _nothing_new(self, batcher: Batcher, now: float) -> bool:
        """Whether the policy, asked for a batcher without a slot, would answer as it last did
        (it would be asked on each of its arrivals, thousands a second): its batch is ready
        and it waits for a slot, or nothing of its queue may leave before ``idle_until`` but a
        full batch, as the policy said without an SLO to change it."""
        if batcher.waiting:
            return True
        return (now < batcher.idle_until and len(batcher.queue) < self.deployment.max_batch
                and not self.deployment.slo_s and (not self.shadow_slo_s or self.slo_changes))

    def _backend(self, batcher: Batcher, now: float, free: int, taken: bool = False
                 ) -> Backend:
        """What the batcher's policy knows of the model's backend: with riders, the fleet's
        arrival rate (its own times the batchers), and whether a slot was taken for it."""
        return Backend(free=free, rate=batcher.rate.at(now) * self.fleet,
                       fixed_s=batcher.cost.fixed_s, per_item_s=batcher.cost.per_item_s,
                       slots=batcher.allowed, late_s=batcher.cost.late_s, taken=taken)

    def _ask(self, batcher: Batcher, now: float, free: int, taken: bool = False) -> Plan:
        """The policy's plan for the batcher's queue with ``free`` slots, ``taken`` for it or
        not (and, while a shadow SLO has changed nothing yet, whether it would change this
        plan)."""
        queue = batcher.queue
        slo = self.deployment.slo_s
        waiting = Waiting(LANE, len(queue), queue[0], queue[-1], self.deployment.max_batch,
                          due=queue[0] + slo if slo else None)
        backend = self._backend(batcher, now, free, taken)
        plan = self.policy.plan([waiting], now, {LANE.model: backend})
        if self.shadow_slo_s and not self.slo_changes:
            told = replace(waiting, due=waiting.oldest + self.shadow_slo_s)
            shadow = self.policy.plan([told], now, {LANE.model: backend})
            self.slo_changes = _effect(shadow, batcher, now) != _effect(plan, batcher, now)
        return plan

    def _release(self, now: float) -> None:
        """A slot of the budget frees: the batcher that has waited longest for one takes it,
        and sends what it holds (or hands it on, where nothing of it may leave now)."""
        batcher = self.budget.hand_on()
        if batcher is not None:
            if self.fleet > 1:
                self._ride(batcher)  # its take brings the others' oldest offers along
            self._plan(batcher, now)

    def _give_back(self, batcher: Batcher, now: float) -> None:
        """The slots a batcher was handed and did not use go on to the next waiter."""
        while batcher.granted:
            batcher.granted -= 1
            self._release(now)

    def _wake(self, batcher: Batcher, at: float) -> None:
        """The batcher asks the policy again at ``at`` (unless it already will sooner)."""
        if at < batcher.wake_at:
            batcher.wake_at = at
            self._push(at, _WAKE, batcher)

    def _send(self, batch: _Batch, now: float) -> None:
        """The batch takes a slot of the budget (one handed to its batcher first) and leaves."""
        batch.batcher.idle_until = 0.0  # its queue's oldest changed
        self.budget.take(batch.batcher)
        batch.batcher.in_flight += 1
        if self.fleet > 1:  # riders: it takes the others' offers while its batch runs
            self._pull_later(batch.batcher, now)
        self.batches += 1
        self.batch_sizes += len(batch.arrivals)
        if self.cpu is None:
            self._reach(batch, now)
            return
        size, cpu = len(batch.arrivals), self.cpu
        sent = batch.batcher.server.run(now, cpu.batcher_batch_s / 2
                                        + size * cpu.batcher_task_s / 3)
        batch.batcher.batch_work_until = sent
        self._push(sent, _REACH, batch)

    def _reach(self, batch: _Batch, now: float) -> None:
        """The batch's call reaches Triton: an instance takes it, or it waits for one (with
        a shared budget, only where an instance may have more than one batch at Triton)."""
        batch.sent_at = now
        if self.idle > 0:
            self._start(batch, now)
        else:
            self.at_triton.append(batch)

    def _start(self, batch: _Batch, now: float) -> None:
        self.idle -= 1
        seconds = self.cost.sample(len(batch.arrivals), self.rng)
        if now >= self._warmup:
            self.busy_s += seconds
        self._push(now + seconds, _DONE, batch)

    def _push(self, at: float, kind: int, item: _Batch | Batcher | _Boarding) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, item))

    # -- results --------------------------------------------------------------------------------

    def _outcome(self, seconds: float, unfinished: int, stopped: bool = False) -> Outcome:
        ordered = sorted(self.latencies)
        span = max(seconds, 1e-9)
        return Outcome(
            offered=self.offered, served=len(ordered), refused=self.refused, seconds=seconds,
            p50_s=quantile(ordered, 0.50), p90_s=quantile(ordered, 0.90),
            p99_s=quantile(ordered, 0.99), p999_s=quantile(ordered, 0.999),
            mean_s=sum(ordered) / len(ordered) if ordered else 0.0,
            utilisation=min(1.0, self.busy_s / (self.deployment.instances * span)),
            mean_batch=self.batch_sizes / self.batches if self.batches else 0.0,
            flushes=dict(self.flushes), unfinished=unfinished, finished_s=self.last_answer,
            cpu_busy=self._cpu_busy(span), peak_in_flight=self.budget.peak, stopped=stopped,
            slo_changes=self.slo_changes if self.shadow_slo_s else None,
            handovers=self.budget.handovers if self.deployment.shares_budget else 0,
            riders=self.riders)

    def _cpu_busy(self, span: float) -> dict[str, float]:
        """The busiest server of each process: the share of the run it worked (warm-up
        included, so an approximation)."""
        if self.cpu is None:
            return {}
        total = max(span, self.last_answer)
        return {"gateway": max(s.busy_s for s in self.gateways) / total,
                "batcher": max(b.server.busy_s for b in self.batchers) / total,
                "redis": max(s.busy_s for s in self.redis) / total}


def _admission_work(cpu: CpuCost | None) -> tuple[float, float, float]:
    """The CPU of a task's admission, before it boards: its gateway worker's, Redis' and its
    batcher's (the rest of each is the answer's, and the batch's)."""
    cpu = cpu or CpuCost()
    return cpu.gateway_task_s / 2, cpu.redis_task_s / 2, cpu.batcher_task_s / 3


def _effect(plan: Plan, batcher: Batcher, now: float) -> tuple[object, ...]:
    """What a plan makes the simulation do: the batches it sends, and when the batcher asks
    again where that is sooner than it already would (a later wake-up changes nothing)."""
    wake = now + plan.wake_in if plan.wake_in is not None and plan.wake_in > 0 else math.inf
    return plan.flush, wake if wake < batcher.wake_at else None


def _chooser(rng: random.Random, n: int) -> Callable[[], int]:
    """``rng.randrange(n)``, drawing the very bits it draws (so a seed gives the runs it gave),
    without its checks and calls: a run makes one to three picks per task."""
    getrandbits, bits = rng.getrandbits, n.bit_length()

    def pick() -> int:
        value = getrandbits(bits)
        while value >= n:
            value = getrandbits(bits)
        return value

    return pick


def quantile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank quantile of sorted values (0 for none)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def simulate(cost: CostModel, deployment: Deployment, arrivals: Sequence[float],
             seed: int = 0, warmup_s: float | None = None, *, bound: Bound | None = None,
             shadow_slo_s: float = 0.0) -> Outcome:
    """One run (``Simulation``); with a ``bound``, it stops as soon as the bound is broken; with
    a ``shadow_slo_s``, it says whether telling the batchers that SLO would change the run."""
    return Simulation(cost, deployment, seed, warmup_s, bound=bound,
                      shadow_slo_s=shadow_slo_s).run(arrivals)
