"""What the batcher knows of each model it has seen: batch limit, window, breaker, load, cost.

The reader counts arrivals here and refreshes a model's limits from Triton; the dispatcher plans
with each model's free slots; the executor asks a model's breaker and fitted call time, and
reports good calls (``BatchContext``, through the dispatcher); the reporter turns it into the
capacities the gateways admit by.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ferry.errors import BackendError
from ferry.oip.spec import ModelInterface
from ferry.rules.breaker import CircuitBreaker
from ferry.rules.estimators import ArrivalRate, BatchCost, Window
from ferry.rules.policy import Backend, Lane
from ferry.settings import BatcherSettings
from ferry.telemetry.metrics import BatcherMetrics
from ferry.triton.base import InferenceBackend, instance_count
from ferry.triton.pool import TritonPool

if TYPE_CHECKING:
    from ferry.batcher.budget import Budget

INTERFACE_TTL_S = 30.0  # as long as the backend caches a model's spec


@dataclass(frozen=True)
class TensorModel:
    """A tensor model as the batcher uses it: its interface and how many instances run it."""

    interface: ModelInterface
    instances: int


class Interfaces:
    """Tensor models' interfaces, read from Triton's metadata and config, cached for
    ``ttl_s`` per model and version."""

    def __init__(self, backend: InferenceBackend, *, ttl_s: float = INTERFACE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, TensorModel]] = {}

    async def get(self, model: str, version: str = "") -> TensorModel:
        """The model's interface (a ``BackendError`` for a model Triton does not serve or Ferry
        cannot batch in front of)."""
        cached = self._cache.get((model, version))
        if cached is None or self.clock() - cached[0] > self.ttl_s:
            metadata = await self.backend.model_metadata(model, version)
            config = await self.backend.model_config(model, version)
            found = TensorModel(ModelInterface.from_triton(metadata, config),
                                instance_count(config))
            cached = self._cache[(model, version)] = (self.clock(), found)
        return cached[1]


@dataclass
class ModelState:
    """What the dispatcher knows about one model: batch limit, instances, load, call cost, the
    window of batches Triton is given at once, and a circuit breaker per version ('': the
    version Triton's policy picks), made on first call."""

    capacity: int
    window: Window  # batches that may be at Triton at once (at most the instances)
    new_breaker: Callable[[], CircuitBreaker]
    breakers: dict[str, CircuitBreaker] = field(default_factory=dict)
    inflight: int = 0
    freed: bool = False  # a slot freed while every one was busy, and no batch has left since
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    cost: BatchCost = field(default_factory=BatchCost)

    @property
    def slots(self) -> int:
        return self.window.allowed

    def breaker(self, version: str = "") -> CircuitBreaker:
        """The version's circuit breaker."""
        breaker = self.breakers.get(version)
        if breaker is None:
            breaker = self.breakers[version] = self.new_breaker()
        return breaker

    def backend(self, now: float, holding: bool, shared: tuple[int, bool] | None = None,
                fleet: int = 1) -> Backend:
        """What the policy plans the model with. With a shared budget (``shared``: the slots
        taken for its next batches, and whether an ask for one is under way), a slot taken
        is free and freed (what waited for it leaves at once: the pool is busy); with none
        taken and none asked for, one may be asked for (the policy's departure asks). Its
        ``fleet`` batchers share the budget's one queue (``batcher.riders``): the model's
        arrivals are theirs, each reading its share of the partitions (the slots, and the
        company a batch waits for, are the fleet's)."""
        free = 0 if holding else max(0, self.slots - self.inflight)
        freed, taken = self.freed, False
        if shared is not None and not holding:
            granted, asking = shared
            free = granted if granted or asking else 1  # the budget bounds the fleet's
            taken = granted > 0
            freed = freed or taken
        return Backend(free=free, rate=self.rate.at(now) * fleet, fixed_s=self.cost.fixed_s,
                       per_item_s=self.cost.per_item_s, slots=self.slots,
                       late_s=self.cost.late_s, freed=freed, taken=taken and fleet > 1)


class ModelBook:
    """Every model's state, made on first sight with the settings' limits and breaker."""

    def __init__(self, settings: BatcherSettings, backend: TritonPool,
                 metrics: BatcherMetrics) -> None:
        self.settings = settings
        self.backend = backend
        self.metrics = metrics
        self.states: dict[str, ModelState] = {}  # the dispatcher reads it directly, per batch
        self.interfaces = Interfaces(backend)  # tensor models', shared with the executor

    def __iter__(self) -> Iterator[tuple[str, ModelState]]:
        return iter(self.states.items())

    def get(self, model: str) -> ModelState | None:
        """The model's state, None for a model not seen yet."""
        return self.states.get(model)

    def names(self) -> list[str]:
        return list(self.states)

    def state(self, model: str) -> ModelState:
        """The model's state, made on first sight."""
        state = self.states.get(model)
        if state is None:
            s = self.settings
            state = self.states[model] = ModelState(
                s.max_batch, Window(s.max_inflight_batches or 1), lambda: CircuitBreaker(
                    s.breaker_threshold, s.breaker_window_s, s.breaker_min_calls,
                    s.breaker_cooldown_s))
            self.metrics.prime([model])
        return state

    async def refresh(self, model: str, *, tensors: bool = False) -> ModelState:
        """The model's state, its batch limit and instance count refreshed from Triton's config
        (cached by the backend; a tensor model's by ``interfaces``). A tensor model's limit is
        its ``max_batch_size`` in requests (0: one at a time); the executor keeps each call
        within it in rows."""
        state = self.state(model)
        try:
            if tensors:  # its instances over every server of the pool
                found = await self.interfaces.get(model)
                capacity = found.interface.max_batch_size
                instances = sum((await self.backend.count(model)).values()) or found.instances
            else:
                spec = await self.backend.model_spec(model)
                capacity, instances = spec.max_batch_size, spec.instances
        except BackendError:  # the executor reports it with the batch; chunking still applies
            return state
        state.capacity = capacity
        state.window.resize(self.settings.max_inflight_batches
                            or instances * self.settings.batches_per_instance)
        return state

    def slots(self) -> int:
        """Batches that may be at Triton at once, over every model (at least 1)."""
        return sum(m.slots for m in self.states.values()) or 1

    def buffer_quota(self) -> int:
        """Tasks of one priority worth holding in the buffer: a batch per slot, and one more,
        a batch being each model's largest (at most ``max_batch``). No more: what waits in
        Redis keeps its fair order (docs/fairness.md), what is read waits its turn here."""
        cap = self.settings.max_batch
        if not self.states:
            return 2 * cap
        batches = [(min(cap, m.capacity) if m.capacity > 0 else 1, m.slots)
                   for m in self.states.values()]
        return sum(size * slots for size, slots in batches) + max(size for size, _ in batches)

    def all_busy(self) -> bool:
        """Every model this batcher knows has all its slots taken."""
        return bool(self.states) and all(m.inflight >= m.slots for m in self.states.values())

    def backends(self, now: float, holding: bool, budget: Budget | None = None
                 ) -> dict[str, Backend]:
        """What the policy plans with: each model's free slots (from the shared budget while
        it is shared), arrival rate and fixed cost."""
        if budget is None or not budget.shared:
            return {name: m.backend(now, holding) for name, m in self.states.items()}
        return {name: m.backend(now, holding, (budget.free(name), budget.asking(name)),
                                budget.fleet) for name, m in self.states.items()}

    def lane_capacity(self, lane: Lane) -> int:
        """Suspects go one at a time; a model's lane takes what the model takes."""
        if lane.suspect:
            return 1
        state = self.states.get(lane.model)
        return state.capacity if state else self.settings.max_batch

    # -- what the executor asks (through the dispatcher's BatchContext) ------------------------

    def breaker(self, model: str, version: str = "") -> CircuitBreaker:
        return self.state(model).breaker(version)

    def call_time(self, model: str, size: int) -> float:
        """The fitted time of a call of ``size`` (0: not known yet)."""
        state = self.states.get(model)
        return state.cost.time_at(size) if state is not None else 0.0

    def observe_call(self, model: str, size: int, seconds: float) -> None:
        """A good call: it fits the model's cost and moves its window."""
        state = self.states.get(model)
        if state is not None:
            state.window.observe(seconds, state.cost.time_at(size) if state.cost.settled else 0.0)
            state.cost.add(size, seconds)
            self.metrics.window.labels(model).set(state.slots)
