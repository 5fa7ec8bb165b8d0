"""Which partitions a batcher reads: ``owned_partitions`` parsed once, when its settings are
built ('all', a list such as '0-7,12', or 'auto': the supervisor's, from the replica count)."""

from __future__ import annotations

from ferry.errors import ConfigError
from ferry.settings.fields import entries, naming, refuse_duplicates

AUTO = "auto"


def owned(*, owned_partitions: str, partitions: int, replicas: int, statefulset: str,
          replicas_check_s: float) -> tuple[int, ...]:
    """The partitions ``owned_partitions`` names; none for 'auto' (after checking what the
    supervisor needs: it gives every batcher it starts a list of its own)."""
    if not follows_replicas(owned_partitions):
        return naming("owned_partitions", lambda spec: parse_partitions(spec, partitions),
                      owned_partitions)
    if not replicas and not statefulset:
        raise ConfigError("owned_partitions=auto needs replicas or statefulset")
    if replicas < 0 or replicas_check_s <= 0:
        raise ConfigError("replicas must be >= 0 and replicas_check_s > 0")
    return ()


def follows_replicas(spec: str) -> bool:
    """Whether ``owned_partitions`` is 'auto'."""
    return spec.strip().lower() == AUTO


def parse_partitions(spec: str, total: int) -> tuple[int, ...]:
    """Parse 'all' or a list of indices and ranges ('0-3,7') into sorted partition numbers;
    a partition named twice ('0-3,2') is refused."""
    if spec.strip().lower() == "all":
        return tuple(range(total))
    chosen = [number for part in entries("owned_partitions", spec)
              for number in _numbers(spec, part, total)]
    if not chosen:
        raise ConfigError(f"partition list {spec!r} must name partitions in 0..{total - 1}")
    refuse_duplicates("owned_partitions", chosen, "partition {}")
    return tuple(sorted(chosen))


def _numbers(spec: str, part: str, total: int) -> range:
    low, _, high = part.partition("-")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise ConfigError(f"bad partition list {spec!r}: {part!r} is not N or N-M") from None
    if not 0 <= first <= last < total:
        raise ConfigError(f"partition list {spec!r} must name partitions in 0..{total - 1}")
    return range(first, last + 1)
