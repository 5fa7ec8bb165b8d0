"""The simulated batchers and the in-flight budget they share (``ferry.planner.simulate``).

A model's budget is its instances over every Triton replica, times the batches each may hold
(``FERRY_BATCHES_PER_INSTANCE``): as many slots, each a batch at Triton at once, whichever
batcher sent it (``ferry.batcher.budget``). The batchers share them as Ferry's do:

- **First come, first served** (``riders=False``: ``FERRY_BUDGET_RIDERS=false``). A batcher with
  a batch ready and no free slot waits; a slot that frees goes to the batcher that has waited
  longest, whose batch forms then from what it holds. Every slot freed goes back to the budget
  (a hand-over: Redis calls in Ferry).
- **The fleet's one queue** (``riders``, Ferry's default: ``ferry.batcher.riders``). A batcher
  that holds no slot offers the tasks it holds, and each slot taken anywhere (a spare one, or
  one handed to the longest waiter) takes the others' oldest offers along as riders, up to the
  max batch: its batch leaves at once, the batch one queue in front of the instances would
  make. A batcher holding a slot keeps its own work for its own next batch (its tasks are not
  offered) and pulls the others' offers every ``PULL_EVERY_S`` while its batch runs (those its
  next batch carries, formed oldest first over its own and the offers); when a
  call ends with work of its boarded, the slot stays with it and the next batch leaves at once
  (no hand-over: no Redis call). A slot goes back only when its batcher has nothing left.

One lane, so offers go oldest first (Ferry's go high priority first, then oldest). Offers and
riders move at once here; Ferry offers at most every 5 ms and moves riders with a Redis script.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ferry.planner.servers import Server
from ferry.rules.estimators import ArrivalRate, BatchCost, Window

PULL_EVERY_S = 0.005  # a holder takes the waiters' offers this often (batcher.budget's
# OFFER_EVERY_S: the planner does not import the batcher)


@dataclass(slots=True)
class Batcher:
    """What a batcher keeps for the model (``ferry.batcher.worker``), and its place in the
    budget."""

    index: int
    window: Window
    server: Server = field(default_factory=Server)
    batch_work_until: float = 0.0  # when its work on a batch (send, settle) is done
    queue: deque[float] = field(default_factory=deque)  # each boarded task's arrival, in order
    workers: deque[int] = field(default_factory=deque)  # each boarded task's gateway worker
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    cost: BatchCost = field(default_factory=BatchCost)
    in_flight: int = 0
    wake_at: float = math.inf
    allowed: int = 0  # window.allowed, read once each time the window changes
    granted: int = 0  # slots in hand for its next batches (handed to it, taken, or kept)
    waiting: bool = False  # in the line for a slot
    idle_until: float = 0.0  # asked without a slot, the policy let nothing leave before this
    pulling: bool = False  # riders: a pull of the others' offers is due

    def __post_init__(self) -> None:
        self.allowed = self.window.allowed

    @property
    def offering(self) -> bool:
        """Whether its tasks are offered to the fleet: it holds no slot (a batcher with a batch
        at Triton, or a slot in hand, keeps its work for its own next batch)."""
        return not self.in_flight and not self.granted


@dataclass(slots=True)
class Budget:
    """The model's in-flight budget: its slots nobody holds, the batchers with a batch ready
    and no slot, longest waiting first (while one waits, no slot is spare), the batches holding
    one, and the slots batchers gave back to it (hand-overs)."""

    spare: int
    waiters: deque[Batcher] = field(default_factory=deque)
    in_flight: int = 0
    peak: int = 0  # the most batches that held a slot at once
    handovers: int = 0  # slots given back (to the next waiter, or spare)

    def free(self, batcher: Batcher) -> int:
        """The slots ``batcher`` may use now: those in its hand, and the spare."""
        return self.spare + batcher.granted

    def take(self, batcher: Batcher) -> None:
        """A batch of ``batcher`` leaves with a slot: one in its hand first."""
        if batcher.granted:
            batcher.granted -= 1
        else:
            self.spare -= 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def grab(self, batcher: Batcher) -> None:
        """A spare slot taken for ``batcher``'s next batch."""
        self.spare -= 1
        batcher.granted += 1

    def keep(self, batcher: Batcher) -> None:
        """A batch's slot stays with its batcher for its next batch (no hand-over); it no
        longer waits for another."""
        self.leave(batcher)
        batcher.granted += 1

    def wait(self, batcher: Batcher) -> None:
        if not batcher.waiting:
            batcher.waiting = True
            self.waiters.append(batcher)

    def leave(self, batcher: Batcher) -> None:
        """``batcher`` no longer waits for a slot."""
        if batcher.waiting:
            batcher.waiting = False
            self.waiters.remove(batcher)

    def hand_on(self) -> Batcher | None:
        """A slot frees (a batch returned, or a batcher handed back one it could not use): to
        the batcher that has waited longest, which it returns, or to the spare."""
        self.handovers += 1
        if not self.waiters:
            self.spare += 1
            return None
        batcher = self.waiters.popleft()
        batcher.waiting = False
        batcher.granted += 1
        return batcher


def take_riders(taker: Batcher, fleet: Sequence[Batcher], budget: Budget, batch: int, *,
                pulled: bool = False) -> int:
    """The oldest tasks the other batchers offer that ``taker``'s next batch, of ``batch``
    tasks at most, carries, moved aboard it in the order they arrived; how many. A slot taken
    takes them up to its room (``batch`` less what it holds); a pull (``pulled``: its batch
    runs, the next leaves on the same slot) takes, of the oldest ``batch`` over its own and
    the offers, the offers (``budget_ride.lua``): beyond its room, those older than its own.
    An owner left with nothing leaves the line."""
    owners = [b for b in fleet if b is not taker and b.queue and b.offering]
    own = taker.queue if pulled else deque()  # in arrival order
    room = batch if pulled else batch - len(taker.queue)
    riders: list[tuple[float, int]] = []
    before = 0  # its own tasks older than the offer at hand
    while owners:
        owner = min(owners, key=_oldest)
        while before < len(own) and own[before] <= owner.queue[0]:
            before += 1
        if before + len(riders) >= room:
            break
        riders.append((owner.queue.popleft(), owner.workers.popleft()))
        owner.idle_until = 0.0  # its oldest changed
        if not owner.queue:
            owners.remove(owner)
            budget.leave(owner)
    if riders:
        _board(taker, riders)
    return len(riders)


def _oldest(batcher: Batcher) -> float:
    return batcher.queue[0]


def _board(taker: Batcher, riders: list[tuple[float, int]]) -> None:
    """Riders join ``taker``'s queue in the order they arrived (most are older than its own)."""
    aboard = list(heapq.merge(zip(taker.queue, taker.workers, strict=True), riders,
                              key=_arrival))
    taker.queue.clear()
    taker.workers.clear()
    taker.queue.extend(arrival for arrival, _ in aboard)
    taker.workers.extend(worker for _, worker in aboard)
    taker.idle_until = 0.0


def _arrival(task: tuple[float, int]) -> float:
    return task[0]
