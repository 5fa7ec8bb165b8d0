"""Ferry's statistics of its own work, in the shape of Triton's statistics extension. Pure code.

Triton's statistics count what Triton did; behind Ferry that misses Ferry's queue, and every
request Ferry answered without Triton (the result cache, collapsing). So each Ferry process
tallies what it ends, by (model, version): a batcher every task it settles and every Triton call
it made, a gateway every request it answered by sharing another's inference. The tallies are
added into one Redis hash per model with HINCRBY a few times a second (``ferry.oip.served``), so
any number of gateways and batchers merge exactly. A statistics request takes Triton's own
answer (its versions, its errors, the model's memory) and puts Ferry's figures in its place.

What each figure means for Ferry (docs/oip.md says the same):

- ``success``: tasks that ended SUCCESS, from their admission to their result written (a shared
  answer: its admission); ``fail``: tasks that ended FAILED or EXPIRED (a cancelled one is
  neither); ``queue``: every success, from admission to its batch's call to Triton (0 for a
  shared answer); ``compute_infer``: the tasks Triton ran, each its batch's call to Triton
  (``compute_input`` and ``compute_output`` count the same tasks, in no time of their own);
  ``cache_hit``: the shared answers, each its admission; ``cache_miss``: not counted.
- ``inference_count``: the rows Triton ran for Ferry; ``execution_count``: Ferry's calls to
  Triton; ``batch_stats``: those calls by their rows; ``last_inference``: when a batch last
  ended (ms since the epoch).

A task that was left to Triton's version policy and never reached Triton has no version: its
figures count for the newest version Triton lists. In the answer for every model, the steps of
an ensemble keep Triton's own figures: Triton calls them within the ensemble, Ferry never does,
and perf_analyzer reads them to profile the ensemble.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The durations Ferry measures, each a count and nanoseconds; compute_input and compute_output
# take compute_infer's count (perf_analyzer refuses unequal compute counts).
DURATIONS = ("success", "fail", "queue", "compute_infer", "cache_hit")
EXECUTIONS = "executions"
ROWS = "rows"
BATCH = "batch"  # batch.<rows>.n, batch.<rows>.ns: calls of that many rows
SEP = "|"  # between a field's version and its figure
NS_PER_S = 1_000_000_000


def nanoseconds(seconds: float) -> int:
    return max(0, round(seconds * NS_PER_S))


def field_name(version: str, figure: str) -> str:
    """A hash field: the version, then the figure (``1|success.n``)."""
    return f"{version}{SEP}{figure}"


class Served:
    """What one process ended since its last flush, by model: field name to count, and the
    newest end per version (ms)."""

    def __init__(self) -> None:
        self._fields: dict[str, dict[str, int]] = {}
        self._last: dict[tuple[str, str], int] = {}

    def ended(self, model: str, version: str, *, ok: bool, total_s: float,
              infer_s: float = 0.0) -> None:
        """A task a batcher settled: ``ok`` for SUCCESS (else it failed or expired),
        ``total_s`` from admission to its end, ``infer_s`` its batch's Triton call (0: none)."""
        if not ok:
            self._add(model, version, "fail", total_s)
            return
        self._add(model, version, "success", total_s)
        self._add(model, version, "queue", max(0.0, total_s - infer_s))
        if infer_s > 0:
            self._add(model, version, "compute_infer", infer_s)

    def call(self, model: str, version: str, *, rows: int, seconds: float,
             ended_at: float) -> None:
        """One call to Triton of ``rows`` rows that took ``seconds`` and ended by ``ended_at``
        (Unix seconds)."""
        fields = self._of(model)
        fields[field_name(version, f"{EXECUTIONS}.n")] += 1
        fields[field_name(version, f"{ROWS}.n")] += rows
        fields[field_name(version, f"{BATCH}.{rows}.n")] += 1
        fields[field_name(version, f"{BATCH}.{rows}.ns")] += nanoseconds(seconds)
        at_ms = int(ended_at * 1000)
        self._last[(model, version)] = max(at_ms, self._last.get((model, version), 0))

    def shared(self, model: str, version: str, seconds: float) -> None:
        """A request a gateway answered with another's inference (a cache hit, or collapsed
        onto an identical task in flight), ``seconds`` its admission."""
        self._add(model, version, "success", seconds)
        self._add(model, version, "queue", 0.0)
        self._add(model, version, "cache_hit", seconds)

    def _add(self, model: str, version: str, figure: str, seconds: float) -> None:
        fields = self._of(model)
        fields[field_name(version, f"{figure}.n")] += 1
        fields[field_name(version, f"{figure}.ns")] += nanoseconds(seconds)

    def _of(self, model: str) -> dict[str, int]:
        fields = self._fields.get(model)
        if fields is None:
            fields = self._fields[model] = defaultdict(int)
        return fields

    def drain(self) -> Drained:
        """Everything tallied, forgotten here (a failed flush gives it back with ``merge``)."""
        drained = Drained(self._fields, self._last)
        self._fields, self._last = {}, {}
        return drained

    def merge(self, drained: Drained) -> None:
        for model, fields in drained.fields.items():
            mine = self._of(model)
            for name, count in fields.items():
                mine[name] += count
        for key, at_ms in drained.last.items():
            self._last[key] = max(at_ms, self._last.get(key, 0))

    def __len__(self) -> int:
        return len(self._fields)


@dataclass(frozen=True)
class Drained:
    """A flush's worth of tallies: by model, field name to count; and by (model, version),
    the newest end (ms)."""

    fields: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    last: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Counters:
    """One model's figures as Redis holds them: field name to count, version to its newest
    end (ms)."""

    fields: Mapping[str, int] = field(default_factory=dict)
    last: Mapping[str, int] = field(default_factory=dict)

    def of(self, versions: Iterable[str]) -> dict[str, VersionFigures]:
        """Each listed version's figures, those without a version counted for the newest."""
        listed = sorted(set(versions), key=_version_order)
        figures = {version: VersionFigures() for version in listed}
        newest = listed[-1] if listed else None
        for name, count in self.fields.items():
            version, _, figure = name.partition(SEP)
            target = newest if version == "" else version
            if target in figures:
                figures[target].counts[figure] += count
        for version, at_ms in self.last.items():
            target = newest if version == "" else version
            if target in figures:
                figures[target].last = max(figures[target].last, at_ms)
        return figures


def _version_order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


@dataclass
class VersionFigures:
    """One version's counts (figure to count) and its newest end (ms)."""

    counts: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    last: int = 0

    def duration(self, figure: str) -> dict[str, int]:
        return {"count": self.counts[f"{figure}.n"], "ns": self.counts[f"{figure}.ns"]}

    def inference_stats(self) -> dict[str, dict[str, int]]:
        computed = self.counts["compute_infer.n"]
        return {"success": self.duration("success"), "fail": self.duration("fail"),
                "queue": self.duration("queue"),
                "compute_input": {"count": computed, "ns": 0},
                "compute_infer": self.duration("compute_infer"),
                "compute_output": {"count": computed, "ns": 0},
                "cache_hit": self.duration("cache_hit"),
                "cache_miss": {"count": 0, "ns": 0}}

    def batch_stats(self) -> list[dict[str, Any]]:
        sizes = sorted({int(name.split(".")[1]) for name in self.counts
                        if name.startswith(f"{BATCH}.") and name.endswith(".n")})
        return [{"batch_size": size,
                 "compute_input": {"count": self.counts[f"{BATCH}.{size}.n"], "ns": 0},
                 "compute_infer": self.duration(f"{BATCH}.{size}"),
                 "compute_output": {"count": self.counts[f"{BATCH}.{size}.n"], "ns": 0}}
                for size in sizes]


def with_ferry_figures(triton: Mapping[str, Any], counters: Mapping[str, Counters],
                       tritons: Collection[str] = ()) -> dict[str, Any]:
    """Triton's statistics answer with Ferry's figures in place of Triton's: the same models
    and versions, in the same order and shape (memory usage, and any field Ferry does not
    measure, stay Triton's). The models in ``tritons`` keep Triton's own figures."""
    answer = copy.deepcopy(dict(triton))
    stats = [s for s in answer.get("model_stats") or [] if str(s.get("name")) not in tritons]
    listed: dict[str, list[str]] = defaultdict(list)
    for stat in stats:
        listed[str(stat.get("name", ""))].append(str(stat.get("version", "")))
    figures = {model: counters.get(model, Counters()).of(versions)
               for model, versions in listed.items()}
    for stat in stats:
        mine = figures[str(stat.get("name", ""))][str(stat.get("version", ""))]
        stat.update({"last_inference": mine.last, "inference_count": mine.counts[f"{ROWS}.n"],
                     "execution_count": mine.counts[f"{EXECUTIONS}.n"],
                     "inference_stats": mine.inference_stats(),
                     "batch_stats": mine.batch_stats()})
    return answer


def models_in(triton: Mapping[str, Any]) -> list[str]:
    """The models a statistics answer names, each once, in order."""
    return list(dict.fromkeys(str(s.get("name", "")) for s in triton.get("model_stats") or []))
