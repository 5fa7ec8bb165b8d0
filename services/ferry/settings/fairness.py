"""The fair-share settings: each client's weight (``client_weights``)."""

from __future__ import annotations

import math

from ferry.auth.base import MAX_WEIGHT
from ferry.errors import ConfigError


def parse_weights(spec: str) -> dict[str, float]:
    """``client=weight`` entries, comma-separated; a weight is a positive number."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        client, sep, value = part.rpartition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not sep or not client.strip() or not 0 < weight <= MAX_WEIGHT:
            raise ConfigError(f"client_weights: {part!r} is not 'client=weight' with a weight "
                              f"above 0 and at most {MAX_WEIGHT:g}")
        weights[client.strip()] = weight
    return weights
