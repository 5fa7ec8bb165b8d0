"""A model's batch cost t(B) = fixed + per_item · B, with the spread of real calls around it.

Fitted by least squares from (batch size, seconds) points: a sweep through Triton, or Triton's
statistics API (per batch size, a count and total compute time), live or saved to a file.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ferry.errors import ConfigError

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)  # the batch sizes a sweep times


@dataclass(frozen=True)
class CostModel:
    """t(B) in seconds, and the standard deviation of calls around it (``jitter_s``)."""

    fixed_s: float
    per_item_s: float
    jitter_s: float = 0.0
    r2: float = 1.0
    points: tuple[tuple[int, float, float], ...] = field(default=(), compare=False)
    source: str = "given"  # given | sweep | stats
    model: str = ""

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_item_s < 0 or self.jitter_s < 0:
            raise ConfigError("t(B) = fixed + per_item · B needs fixed, per_item and jitter >= 0")
        if self.fixed_s + self.per_item_s <= 0:
            raise ConfigError("t(B) must be positive: give a fixed or a per-item time")

    def time(self, batch: int) -> float:
        return self.fixed_s + self.per_item_s * batch

    def sample(self, batch: int, rng: random.Random) -> float:
        """One call's time: t(B) plus normal jitter, never below half of t(B)."""
        base = self.time(batch)
        if not self.jitter_s:
            return base
        return max(0.5 * base, rng.gauss(base, self.jitter_s))

    def throughput(self, batch: int, instances: int = 1) -> float:
        """Tasks per second at full batches of ``batch`` on ``instances``."""
        return instances * batch / self.time(batch)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["t_fixed_ms"], data["t_per_ms"] = self.fixed_s * 1e3, self.per_item_s * 1e3
        data["jitter_ms"] = self.jitter_s * 1e3
        data["points"] = [{"batch": b, "ms": t * 1e3, "weight": w} for b, t, w in self.points]
        for key in ("fixed_s", "per_item_s", "jitter_s"):
            del data[key]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CostModel:
        try:
            return cls(fixed_s=float(data["t_fixed_ms"]) / 1e3,
                       per_item_s=float(data["t_per_ms"]) / 1e3,
                       jitter_s=float(data.get("jitter_ms", 0.0)) / 1e3,
                       r2=float(data.get("r2", 1.0)),
                       points=tuple((int(p["batch"]), float(p["ms"]) / 1e3,
                                     float(p.get("weight", 1.0)))
                                    for p in data.get("points", [])),
                       source=str(data.get("source", "given")), model=str(data.get("model", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a fit file (t_fixed_ms, t_per_ms...): {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> CostModel:
        return cls.from_json(read_json(path, "fit file"))


def read_json(path: Path, what: str) -> Any:
    """A JSON file's contents; a ConfigError naming ``what`` if it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc


def fit(points: Iterable[tuple[int, float, float]], *, source: str, model: str = "") -> CostModel:
    """Weighted least squares of seconds on batch size over ``(batch, seconds, weight)`` points
    (a point may stand for many calls: its weight); the jitter is the weighted residual spread."""
    rows = [(int(b), float(t), float(w)) for b, t, w in points if w > 0]
    if not rows:
        raise ConfigError("no calls to fit t(B) from")
    total = sum(w for _, _, w in rows)
    mean_b = sum(b * w for b, _, w in rows) / total
    mean_t = sum(t * w for _, t, w in rows) / total
    var_b = sum(w * (b - mean_b) ** 2 for b, _, w in rows) / total
    if var_b > 0:
        slope = sum(w * (b - mean_b) * (t - mean_t) for b, t, w in rows) / total / var_b
    else:
        slope = 0.0
    slope = max(0.0, slope)
    intercept = max(0.0, mean_t - slope * mean_b)
    residual = sum(w * (t - intercept - slope * b) ** 2 for b, t, w in rows) / total
    spread = sum(w * (t - mean_t) ** 2 for _, t, w in rows) / total
    r2 = 1.0 - residual / spread if spread > 0 else 1.0
    return CostModel(fixed_s=intercept, per_item_s=slope, jitter_s=math.sqrt(residual), r2=r2,
                     points=tuple(sorted(rows)), source=source, model=model)


def points_from_stats(stats: Mapping[str, Any], model: str = "") -> list[tuple[int, float, float]]:
    """(batch size, mean compute seconds, calls) per batch size from Triton's statistics (the
    HTTP ``/v2/models/<m>/stats`` JSON or the gRPC reply as a dict): compute input + infer +
    output, the time the model itself took."""
    entries = stats.get("model_stats", [stats])
    chosen = [e for e in entries if not model or e.get("name") == model] or list(entries)
    points: list[tuple[int, float, float]] = []
    for entry in chosen[:1]:
        for row in entry.get("batch_stats", []) or []:
            count = _count(row.get("compute_infer", {}))
            if not count:
                continue
            nanos = sum(_nanos(row.get(part, {})) for part in
                        ("compute_input", "compute_infer", "compute_output"))
            points.append((int(row["batch_size"]), nanos / count / 1e9, float(count)))
    return points


def _count(duration: Mapping[str, Any]) -> int:
    return int(duration.get("count", 0) or 0)  # gRPC dicts hold uint64 as strings


def _nanos(duration: Mapping[str, Any]) -> int:
    return int(duration.get("ns", 0) or 0)


def weigh(samples: Sequence[tuple[int, float]]) -> list[tuple[int, float, float]]:
    """Points of weight 1 from measured (batch, seconds) calls."""
    return [(b, t, 1.0) for b, t in samples]
