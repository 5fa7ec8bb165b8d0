"""What the batcher knows of each model it has seen: batch limit, window, breaker, load, cost.

The reader counts arrivals here and refreshes a model's limits from Triton; the dispatcher plans
with each model's free slots; the executor asks a model's breaker and fitted call time, and
reports good calls (``BatchContext``, through the dispatcher); the reporter turns it into the
capacities the gateways admit by.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ferry.batching.breaker import CircuitBreaker
from ferry.batching.estimators import ArrivalRate, BatchCost, Window
from ferry.batching.policy import Backend, Lane
from ferry.errors import BackendError
from ferry.settings import BatcherSettings
from ferry.telemetry.metrics import BatcherMetrics
from ferry.triton.base import InferenceBackend


@dataclass
class ModelState:
    """What the dispatcher knows about one model: batch limit, instances, load, call cost, the
    window of batches Triton is given at once, and the model's circuit breaker."""

    capacity: int
    window: Window  # batches that may be at Triton at once (at most the instances)
    breaker: CircuitBreaker
    inflight: int = 0
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    cost: BatchCost = field(default_factory=BatchCost)

    @property
    def slots(self) -> int:
        return self.window.allowed

    def backend(self, now: float, holding: bool) -> Backend:
        free = 0 if holding else max(0, self.slots - self.inflight)
        return Backend(free=free, rate=self.rate.at(now), fixed_s=self.cost.fixed_s)


class ModelBook:
    """Every model's state, made on first sight with the settings' limits and breaker."""

    def __init__(self, settings: BatcherSettings, backend: InferenceBackend,
                 metrics: BatcherMetrics) -> None:
        self.settings = settings
        self.backend = backend
        self.metrics = metrics
        self.states: dict[str, ModelState] = {}  # the dispatcher reads it directly, per batch

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
            breaker = CircuitBreaker(s.breaker_threshold, s.breaker_window_s,
                                     s.breaker_min_calls, s.breaker_cooldown_s)
            state = self.states[model] = ModelState(
                s.max_batch, Window(s.max_inflight_batches or 1), breaker)
        return state

    async def refresh(self, model: str) -> ModelState:
        """The model's state, its batch limit and instance count refreshed from Triton's config
        (cached by the backend)."""
        state = self.state(model)
        try:
            spec = await self.backend.model_spec(model)
        except BackendError:  # the executor reports it with the batch; chunking still applies
            return state
        state.capacity = spec.max_batch_size
        state.window.resize(self.settings.max_inflight_batches or spec.instances)
        return state

    def slots(self) -> int:
        """Batches that may be at Triton at once, over every model (at least 1)."""
        return sum(m.slots for m in self.states.values()) or 1

    def all_busy(self) -> bool:
        """Every model this batcher knows has all its slots taken."""
        return bool(self.states) and all(m.inflight >= m.slots for m in self.states.values())

    def backends(self, now: float, holding: bool) -> dict[str, Backend]:
        """What the policy plans with: each model's free slots, arrival rate and fixed cost."""
        return {name: m.backend(now, holding) for name, m in self.states.items()}

    def lane_capacity(self, lane: Lane) -> int:
        """Suspects go one at a time; a model's lane takes what the model takes."""
        if lane.suspect:
            return 1
        state = self.states.get(lane.model)
        return state.capacity if state else self.settings.max_batch

    # -- what the executor asks (through the dispatcher's BatchContext) ------------------------

    def breaker(self, model: str) -> CircuitBreaker:
        return self.state(model).breaker

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
