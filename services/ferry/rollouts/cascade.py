"""The two-tier cascade: a model whose answers a second, heavier model reviews. Pure code.

Declared per model (``FERRY_CASCADES``, a JSON object)::

    {"moderation": {"review_model": "moderation_heavy", "review_version": "",
                    "when": "unsafe"}}

``when`` is ``always``; ``unsafe`` (the answer's ``unsafe`` field is true); ``label_above:S``
(any label scoring at least S); or ``labels:A,B`` (any of those labels, at any score). The first
answer is returned as usual; the review runs as a batch-priority task (behind every interactive
request, never aging ahead of one), and the first task's record gains ``review``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ferry.errors import ConfigError
from ferry.rollouts.compare import labels_of

CONDITIONS = ("always", "unsafe", "label_above:<score>", "labels:<a,b,...>")


@dataclass(frozen=True)
class Cascade:
    model: str
    review_model: str
    review_version: str = ""
    when: str = "always"

    def wants_review(self, output: Any) -> bool:
        """Whether the first answer (its record's output) is to be reviewed."""
        kind, _, argument = self.when.partition(":")
        if kind == "always":
            return True
        if kind == "unsafe":
            return any(holder.get("unsafe") is True for holder in _dicts(output))
        if kind == "label_above":
            return bool(labels_of(output, float(argument)))
        wanted = {label.strip() for label in argument.split(",") if label.strip()}
        return bool(labels_of(output, -float("inf")) & wanted)


def _dicts(value: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def parse_cascades(spec: str) -> dict[str, Cascade]:
    """The cascades a JSON object declares (``ConfigError`` saying what is wrong)."""
    if not spec.strip():
        return {}
    try:
        doc = orjson.loads(spec)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"cascades is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError("cascades must be a JSON object: {model: {review_model, when}}")
    return {model: _cascade(model, entry) for model, entry in doc.items()}


def _cascade(model: str, entry: Any) -> Cascade:
    if not isinstance(entry, Mapping) or not entry.get("review_model"):
        raise ConfigError(f"cascade of {model!r} needs a review_model")
    unknown = set(entry) - {"review_model", "review_version", "when"}
    if unknown:
        raise ConfigError(f"cascade of {model!r}: unknown field(s) {sorted(unknown)}")
    when = str(entry.get("when", "always"))
    kind, _, argument = when.partition(":")
    valid = (kind in ("always", "unsafe") and not argument) or (kind == "labels" and argument)
    if kind == "label_above":
        try:
            valid = 0 <= float(argument) <= 1
        except ValueError:
            valid = False
    if not valid:
        raise ConfigError(f"cascade of {model!r}: 'when' must be one of "
                          f"{', '.join(CONDITIONS)}, not {when!r}")
    review_model = str(entry["review_model"])
    version = str(entry.get("review_version", "") or "")
    if version and not version.isdigit():
        raise ConfigError(f"cascade of {model!r}: review_version must be a version number")
    if review_model == model and not version:
        raise ConfigError(f"cascade of {model!r}: a model reviewing itself needs a "
                          "review_version")
    return Cascade(model, review_model, version, when)


def pending_review(task_id: str, model: str, version: str) -> dict[str, str]:
    """A review's entry in the reviewed task's record until it ends: the review's finish finds
    it by these exact bytes (``orjson.dumps``) and writes its end in its place."""
    review = {"status": "PENDING", "task_id": task_id, "model": model}
    if version:
        review["model_version"] = version
    return review
