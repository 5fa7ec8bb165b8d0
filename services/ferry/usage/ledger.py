"""What each client costs: the ledger's fields, hours and sums. Pure code, no I/O.

The completion script counts every task once, in the step that writes its final record, into
its partition's hash for the hour (``keys.ledger_key``): under ``<client>\\t<model>\\t<measure>``
it adds 1 to ``tasks``, the task's rows to ``rows`` and its share of its call's Triton time, in
whole microseconds, to ``gpu_us``. A tab never occurs in a client id (an authenticated one is
``auth.base.CLIENT_ID``; one a request names, like a model's name, must be printable), so the
field splits back without ambiguity. A reader adds up the hashes of every partition and hour.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ferry.durations import seconds_of
from ferry.errors import BadRequestError
from ferry.v1.task_pb2 import Task

SEPARATOR = "\t"
MEASURES = ("tasks", "rows", "gpu_us")
ANONYMOUS = "(anonymous)"  # tasks with no client id; '(' is never in an authenticated one
SHADOWS = "(shadow)"  # a rollout's shadow copies: the operator's cost, not a client's
HOUR_S = 3600
HOUR_FORMAT = "%Y%m%d%H"  # UTC


def client_of(task: Task) -> str:
    """Who a task is charged to: its client, ``(anonymous)`` or ``(shadow)``."""
    if task.shadow_of:
        return SHADOWS
    return task.client_id or ANONYMOUS


def field_prefix(client: str, model: str) -> str:
    """The start of a client's and model's fields; the script appends each measure."""
    return f"{client}{SEPARATOR}{model}{SEPARATOR}"


def hour_of(at: float) -> str:
    """The ledger's hour (UTC) a time falls in: ``2026112704``."""
    return datetime.fromtimestamp(at, UTC).strftime(HOUR_FORMAT)


def hours_between(start: float, end: float) -> list[str]:
    """Every hour from the one ``start`` falls in to the one ``end`` falls in, oldest first."""
    first, last = int(start // HOUR_S), int(end // HOUR_S)
    return [hour_of(hour * HOUR_S) for hour in range(first, last + 1)]


def shares_us(total_s: float, rows: Sequence[int]) -> list[int]:
    """A call's Triton time split over its tasks by their rows, in whole microseconds that add
    up to the call's (largest remainders take the leftover microseconds)."""
    total_us, weight = round(total_s * 1_000_000), sum(rows)
    if weight <= 0:
        return [0] * len(rows)
    exact = [total_us * r / weight for r in rows]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(rows)), key=lambda i: shares[i] - exact[i])
    for i in by_remainder[:total_us - sum(shares)]:
        shares[i] += 1
    return shares


def parse_since(raw: str | None, default_s: int, max_s: int) -> int:
    """A window back from now (``1h``, ``24h``, ``7d``, ``90m``) in seconds, or a 400."""
    if raw is None:
        return default_s
    seconds = seconds_of(raw, max_s)
    if not seconds:
        raise BadRequestError("invalid_since", "since is a number and a unit (s, m, h, d), "
                              f"e.g. '24h', above 0 and at most {max_s // 86400}d, not "
                              f"{str(raw)[:40]!r}")
    return seconds


@dataclass(frozen=True)
class Usage:
    """One client's use of one model over a window."""

    client: str
    model: str
    tasks: int = 0
    rows: int = 0
    gpu_us: int = 0

    @property
    def gpu_seconds(self) -> float:
        return self.gpu_us / 1_000_000

    def to_json(self) -> dict[str, object]:
        return {"client": self.client, "model": self.model, "tasks": self.tasks,
                "rows": self.rows, "gpu_seconds": self.gpu_seconds}


def summed(hashes: Iterable[Mapping[str, int]], model: str = "") -> list[Usage]:
    """The hashes' counts added up per client and model (only ``model``'s, if named), the most
    GPU time first (then by client and model)."""
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for fields in hashes:
        for name, count in fields.items():
            parts = name.split(SEPARATOR)
            if len(parts) != 3 or parts[2] not in MEASURES or (model and parts[1] != model):
                continue
            counts = totals.setdefault((parts[0], parts[1]), dict.fromkeys(MEASURES, 0))
            counts[parts[2]] += count
    rows = [Usage(client, name, **counts) for (client, name), counts in totals.items()]
    return sorted(rows, key=lambda u: (-u.gpu_us, u.client, u.model))


def total(rows: Iterable[Usage]) -> Usage:
    """Every row's counts added up."""
    tasks = gpu_us = count = 0
    for row in rows:
        tasks, count, gpu_us = tasks + row.tasks, count + row.rows, gpu_us + row.gpu_us
    return Usage("", "", tasks, count, gpu_us)


def report(rows: Sequence[Usage], since_s: int, now: float, model: str = "") -> dict[str, object]:
    """The admin route's answer: the window (from the start of its first hour), each row, and
    the totals."""
    totals = total(rows).to_json()
    del totals["client"], totals["model"]
    return {"since_s": since_s, "from": (now - since_s) // HOUR_S * HOUR_S, "until": now,
            "model": model or None,
            "usage": [row.to_json() for row in rows], "total": totals}
