"""Durations as people write them: a number and a unit (``30m``, ``24h``, ``7d``)."""

from __future__ import annotations

import re

from ferry.errors import BadRequestError

WINDOW = re.compile(r"^(\d{1,4})([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds_of(raw: str, max_s: float) -> int:
    """``raw`` in seconds; 0 when it is not a number and a unit, or is over ``max_s``."""
    match = WINDOW.fullmatch(raw.strip())
    seconds = int(match[1]) * UNIT_S[match[2]] if match else 0
    return seconds if 0 < seconds <= max_s else 0


def parse_window(raw: str | None, default_s: float, max_s: float) -> float:
    """A completion window (``30m``, ``24h``, ``7d``) in seconds, or a 400."""
    if raw is None:
        return default_s
    seconds = seconds_of(raw, max_s)
    if not seconds:
        raise BadRequestError("invalid_completion_window", f"completion_window is a number and "
                              f"a unit (s, m, h, d), e.g. '24h', above 0 and at most "
                              f"{max_s / 3600:g}h, not {str(raw)[:40]!r}")
    return float(seconds)
