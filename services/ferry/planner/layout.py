"""How a count of model instances is laid out on Triton replicas: every replica runs as many
(its model config's ``instance_group`` count), and together they are the in-flight budget the
batchers share. The sizing counts instances; a ``Layout`` turns a count into replicas, each running
as many instances: the fewest replicas that hold it, at most ``most_per_replica`` on each (one where
nothing is said: a replica a GPU, as Triton's default instance group runs the model once per
GPU, and as a ``ferry plan fit`` sweep measured t(B), one call at a time), or on the replicas
(``--replicas``) or with the instances per replica (``--instances-per-replica``) the user fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ferry.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """What the user fixed of the replicas (``ferry plan size``'s flags); ``of`` lays out a
    count."""

    replicas: int = 0  # fixed; 0: as few as hold the instances
    per_replica: int = 0  # fixed; 0: as few as hold them, up to most_per_replica
    most_per_replica: int = 0  # 0: one where the replicas are free, no bound where fixed

    def __post_init__(self) -> None:
        if min(self.replicas, self.per_replica, self.most_per_replica) < 0:
            raise ConfigError("replicas and instances per replica must be at least 1")
        if self.per_replica and self.most_per_replica:
            raise ConfigError("--instances-per-replica and --max-instances-per-replica exclude "
                              "each other")

    @property
    def bound(self) -> int | None:
        """The most instances on one replica; None: no bound."""
        if self.per_replica or self.most_per_replica:
            return self.per_replica or self.most_per_replica
        return None if self.replicas else 1

    def most(self, limit: int) -> int:
        """The most instances the layout holds, at most ``limit``."""
        bound = self.bound
        return min(limit, self.replicas * bound) if self.replicas and bound else limit

    def of(self, instances: int) -> tuple[int, int]:
        """Replicas and instances per replica holding at least ``instances`` (at most
        ``most``): the fewest replicas, then the fewest instances on each. (The total grows
        with ``instances``: a search over counts is a search over layouts.)"""
        if self.replicas:
            return self.replicas, self.per_replica or math.ceil(instances / self.replicas)
        each = self.bound or 1  # (a bound: the replicas are free)
        replicas = math.ceil(instances / each)
        return replicas, self.per_replica or math.ceil(instances / replicas)

    def describe(self) -> str:
        """What the layout fixes, for a message: `` (on 4 replicas of at most 2 instances)``
        (nothing for the default, one instance a replica)."""
        if self.per_replica or self.most_per_replica:
            each = ("" if self.per_replica else "at most ") + _instances(
                self.per_replica or self.most_per_replica)
        else:
            each = ""
        if self.replicas:
            on = f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
            return f" (on {on}" + (f" of {each})" if each else ")")
        return f" ({each} a replica)" if each else ""


def _instances(count: int) -> str:
    return f"{count} instance{'s' if count > 1 else ''}"
