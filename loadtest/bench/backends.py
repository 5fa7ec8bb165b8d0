"""The simulated backends the benchmark serves, and the Triton model variants for each system.

A backend is the sim model with a batch cost t(B) = fixed + per_item · B. For each backend and
instance count the repository holds three models:

* ``<name>``: no Triton batching; Ferry sends it whole batches, and Triton alone driven one
  request at a time through it is the unbatched baseline;
* ``<name>_dyn0``: Triton's own dynamic batcher, ``max_queue_delay`` 0 (Triton's default);
* ``<name>_dyn50``: the same with Ferry's max wait (50 ms) as the queue delay.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ferry.stack.up import bundled_repository

MAX_BATCH = 64


@dataclass(frozen=True)
class Backend:
    label: str
    fixed_ms: float
    per_item_ms: float

    def t_ms(self, batch: int) -> float:
        """Time of one execution of ``batch`` items."""
        return self.fixed_ms + self.per_item_ms * batch

    def batched_capacity(self, instances: int) -> float:
        """Requests per second with every execution full."""
        return instances * MAX_BATCH / (self.t_ms(MAX_BATCH) / 1000.0)

    def unbatched_capacity(self, instances: int) -> float:
        return instances / (self.t_ms(1) / 1000.0)


FAST = Backend("fast", 4.0, 0.25)
SLOW = Backend("slow", 50.0, 2.0)


@dataclass(frozen=True)
class Scenario:
    """One backend with one instance count: the models each system uses."""

    backend: Backend
    instances: int

    @property
    def name(self) -> str:
        return f"{self.backend.label}_{self.instances}i"

    @property
    def title(self) -> str:
        b = self.backend
        return (f"{b.label} backend, t(B) = {b.fixed_ms:g} + {b.per_item_ms:g}·B ms, "
                f"{self.instances} instance{'s' if self.instances > 1 else ''}")

    def model(self, system: str) -> str:
        """The Triton model a system sends to."""
        return {"triton-dyn0": f"{self.name}_dyn0",
                "triton-dyn50": f"{self.name}_dyn50"}.get(system, self.name)


def write_repository(target: Path, scenarios: list[Scenario], max_wait_ms: float) -> Path:
    """A model repository with every scenario's three variants of the sim model."""
    sim = bundled_repository() / "sim"
    source = (sim / "config.pbtxt").read_text()
    if target.exists():
        shutil.rmtree(target)
    for scenario in scenarios:
        b = scenario.backend
        variants = {scenario.name: "",
                    f"{scenario.name}_dyn0": "dynamic_batching { }\n",
                    f"{scenario.name}_dyn50": "dynamic_batching { max_queue_delay_microseconds: "
                                              f"{int(max_wait_ms * 1000)} }}\n"}
        for name, batching in variants.items():
            folder = target / name
            shutil.copytree(sim, folder, ignore=shutil.ignore_patterns("__pycache__"))
            config = (source.replace('name: "sim"', f'name: "{name}"')
                      .replace('string_value: "5" }', f'string_value: "{b.fixed_ms:g}" }}')
                      .replace('string_value: "0.1" }', f'string_value: "{b.per_item_ms:g}" }}')
                      .replace("count: 1, kind: KIND_CPU",
                               f"count: {scenario.instances}, kind: KIND_CPU"))
            (folder / "config.pbtxt").write_text(config + batching)
    return target
