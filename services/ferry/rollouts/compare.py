"""Whether a shadow's answer agrees with the primary's. Pure code, no I/O.

The kinds of comparison (a rollout's ``compare`` object, ``kind`` "auto" by default):

- ``tensors``: an Open Inference Protocol answer (``outputs``, each with ``data``): the
  maximum absolute and relative difference over every element; they agree within ``atol`` or
  ``rtol``.
- ``moderation``: the same set of labels (detections scoring at least ``score``) and the same
  ``unsafe`` decision.
- ``labels``: the same set of labels scoring at least ``score`` (any object with a ``label``).
- ``equal``: the same JSON, numbers within ``atol``.

``auto`` takes ``tensors`` for an answer with ``outputs``, ``moderation`` for one with an
``unsafe`` field, ``labels`` for one with labels, else ``equal``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ferry.settings.declarations import KINDS, Comparison

# How a rollout declares its comparison is the settings' (they check the ``rollouts`` setting
# when they are built, and import no feature): named here too.
__all__ = ["KINDS", "Comparison", "Verdict", "compare", "kind_of", "labels_of"]


@dataclass(frozen=True)
class Verdict:
    """How two answers compare: agreement, what differs, each side's labels (for the drift
    check), and for tensors the largest differences."""

    agree: bool
    kind: str
    detail: str = ""
    labels: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
    unsafe: tuple[bool | None, bool | None] = (None, None)
    max_abs: float = 0.0
    max_rel: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def compare(primary: Any, shadow: Any, how: Comparison) -> Verdict:
    """Compare the primary's answer with the shadow's."""
    kind = how.kind if how.kind != "auto" else kind_of(primary)
    if kind == "tensors":
        return _tensors(primary, shadow, how)
    labels = (labels_of(primary, how.score), labels_of(shadow, how.score))
    unsafe = (_unsafe(primary), _unsafe(shadow))
    if kind == "moderation":
        agree = labels[0] == labels[1] and unsafe[0] == unsafe[1]
        detail = "" if agree else _label_detail(labels) + (
            f"; unsafe {unsafe[0]} vs {unsafe[1]}" if unsafe[0] != unsafe[1] else "")
    elif kind == "labels":
        agree = labels[0] == labels[1]
        detail = "" if agree else _label_detail(labels)
    else:
        difference = _first_difference(primary, shadow, how.atol, "$")
        agree, detail = difference is None, difference or ""
    return Verdict(agree, kind, detail, labels, unsafe)


def kind_of(answer: Any) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("outputs"), list):
        return "tensors"
    if any(True for _ in _find(answer, "unsafe")):
        return "moderation"
    if any(True for _ in _find(answer, "label")):
        return "labels"
    return "equal"


def labels_of(answer: Any, score: float) -> frozenset[str]:
    """Every ``label`` in the answer whose object's ``score`` (if any) is at least ``score``."""
    found = set()
    for holder in _holders(answer, "label"):
        value = holder.get("score")
        if not isinstance(value, int | float) or value >= score:
            found.add(str(holder["label"]))
    return frozenset(found)


def _unsafe(answer: Any) -> bool | None:
    return next((bool(v) for v in _find(answer, "unsafe")), None)


def _holders(answer: Any, key: str) -> Iterator[dict[str, Any]]:
    if isinstance(answer, dict):
        if key in answer:
            yield answer
        for value in answer.values():
            yield from _holders(value, key)
    elif isinstance(answer, list):
        for value in answer:
            yield from _holders(value, key)


def _find(answer: Any, key: str) -> Iterator[Any]:
    for holder in _holders(answer, key):
        yield holder[key]


def _label_detail(labels: tuple[frozenset[str], frozenset[str]]) -> str:
    only_primary = sorted(labels[0] - labels[1])
    only_shadow = sorted(labels[1] - labels[0])
    return f"labels only in the primary's: {only_primary}, only in the shadow's: {only_shadow}"


def _first_difference(a: Any, b: Any, atol: float, path: str) -> str | None:
    """Where two JSON values first differ (numbers within ``atol`` are equal); None: nowhere."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(a)} vs {sorted(b)}"
        pairs = [(a[k], b[k], f"{path}.{k}") for k in sorted(a)]
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items vs {len(b)}"
        pairs = [(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
    else:
        return None if _same(a, b, atol) else f"{path}: {str(a)[:60]!r} vs {str(b)[:60]!r}"
    return next((found for x, y, where in pairs
                 if (found := _first_difference(x, y, atol, where))), None)


def _same(a: Any, b: Any, atol: float) -> bool:
    numbers = (isinstance(a, int | float) and isinstance(b, int | float)
               and not isinstance(a, bool) and not isinstance(b, bool))
    return abs(a - b) <= atol if numbers else bool(a == b)


def _tensors(primary: Any, shadow: Any, how: Comparison) -> Verdict:
    """Element-wise differences of the outputs both answers have, by name."""
    mine = _outputs(primary)
    theirs = _outputs(shadow)
    if set(mine) != set(theirs):
        return Verdict(False, "tensors", f"outputs {sorted(mine)} vs {sorted(theirs)}")
    max_abs = max_rel = 0.0
    for name, (shape, data) in mine.items():
        other_shape, other = theirs[name]
        if shape != other_shape or len(data) != len(other):
            return Verdict(False, "tensors", f"{name}: shape {shape} vs {other_shape}")
        for x, y in zip(data, other, strict=True):
            if not (isinstance(x, int | float) and isinstance(y, int | float)):
                if x != y:
                    return Verdict(False, "tensors", f"{name}: {x!r} vs {y!r}")
                continue
            diff = abs(float(x) - float(y))
            if math.isnan(diff):
                diff = 0.0 if math.isnan(float(x)) and math.isnan(float(y)) else math.inf
            max_abs = max(max_abs, diff)
            max_rel = max(max_rel, diff / max(abs(float(x)), abs(float(y)), 1e-12))
    agree = max_abs <= how.atol or max_rel <= how.rtol
    detail = "" if agree else f"max abs diff {max_abs:g}, max rel diff {max_rel:g}"
    return Verdict(agree, "tensors", detail, max_abs=max_abs, max_rel=max_rel)


def _outputs(answer: Any) -> dict[str, tuple[tuple[int, ...], list[Any]]]:
    found = {}
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    for output in outputs if isinstance(outputs, list) else []:
        if isinstance(output, dict) and "name" in output:
            data = output.get("data")
            found[str(output["name"])] = (tuple(output.get("shape") or ()),
                                          list(_flat(data)))
    return found


def _flat(data: Any) -> Iterator[Any]:
    if isinstance(data, list):
        for item in data:
            yield from _flat(item)
    elif data is not None:
        yield data
