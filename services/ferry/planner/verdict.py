"""The planner's predictions judged against measurements: one table shape and one rule, for
``make bench``'s configurations (``validate``) and the GPU kit's runs (``validate_gpu``).

A rate is past saturation once it, or a lower rate of the same configuration, achieved less than
95% of its offered load; below that, the predicted p99 must be within 20% of the measured one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from ferry.planner.deployment import Outcome

GOAL = 0.20  # p99 within 20% below saturation
SATURATED = 0.95  # past saturation: less than this share of the offered rate achieved
HEADER = ["| offered/s | achieved/s | measured p50 | predicted p50 | measured p99 | "
          "predicted p99 | p99 error | within 20% |", "|---|---|---|---|---|---|---|---|"]


class Measured(Protocol):
    """What a measured rate offers the table (``validate.Measured``, ``validate_gpu.Point``)."""

    @property
    def offered(self) -> float: ...
    @property
    def achieved(self) -> float: ...
    @property
    def p50_s(self) -> float: ...
    @property
    def p99_s(self) -> float: ...


R = TypeVar("R", bound=Measured)


def short(row: Measured) -> bool:
    """Whether ``row`` achieved less than ``SATURATED`` of its offered rate."""
    return row.achieved < SATURATED * row.offered


def unsaturated(rows: Sequence[R]) -> list[R]:
    """The rows (by rate) before the first that fell short."""
    first = next((i for i, row in enumerate(rows) if short(row)), len(rows))
    return list(rows[:first])


def table(rows: Sequence[R], predict: Callable[[R], Outcome]) -> tuple[list[str], int, int]:
    """The table of ``rows`` (by rate) against ``predict``'s outcomes, and (rates within the
    goal, rates below saturation)."""
    lines, below, within = list(HEADER), len(unsaturated(rows)), 0
    for index, row in enumerate(rows):
        guess = predict(row)
        error = (guess.p99_s - row.p99_s) / row.p99_s
        good = abs(error) <= GOAL
        verdict = ("yes" if good else "**no**") if index < below else "past saturation"
        within += good and index < below
        lines.append(f"| {row.offered:,.0f} | {row.achieved:,.0f} | {row.p50_s * 1e3:.1f} | "
                     f"{guess.p50_s * 1e3:.1f} | {row.p99_s * 1e3:.1f} | "
                     f"{guess.p99_s * 1e3:.1f} | {error:+.0%} | {verdict} |")
    return lines, within, below
