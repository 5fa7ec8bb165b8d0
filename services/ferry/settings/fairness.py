"""The fair-share settings: each client's weight (``client_weights``)."""

from __future__ import annotations

import math

from ferry.errors import ConfigError
from ferry.settings.auth import CLIENT_ID, MAX_WEIGHT
from ferry.settings.fields import entries, refuse_duplicates


def parse_weights(spec: str) -> dict[str, float]:
    """``client=weight`` entries, comma-separated; a client is a client id (as a credential
    names it), given once, and a weight a positive number."""
    pairs = [_weighted(part) for part in entries("client_weights", spec)]
    refuse_duplicates("client_weights", (client for client, _ in pairs))
    return dict(pairs)


def _weighted(part: str) -> tuple[str, float]:
    client, sep, value = (text.strip() for text in part.rpartition("="))
    try:
        weight = float(value)
    except ValueError:
        weight = math.nan
    if not sep or not CLIENT_ID.fullmatch(client) or not 0 < weight <= MAX_WEIGHT:
        raise ConfigError(f"client_weights: {part!r} is not 'client=weight' with a client id "
                          f"(letters, digits, ._:@/+=-) and a weight above 0 and at most "
                          f"{MAX_WEIGHT:g}")
    return client, weight
