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

from typing import Any

from ferry.rollouts.compare import labels_of
from ferry.settings.declarations import CONDITIONS, Cascade, parse_cascades

# A cascade's declaration, and how the settings parse it, are the settings' (they check the
# ``cascades`` setting when they are built, and import no feature): named here too.
__all__ = ["CONDITIONS", "Cascade", "parse_cascades", "pending_review", "wants_review"]


def wants_review(cascade: Cascade, output: Any) -> bool:
    """Whether the first answer (its record's output) is to be reviewed."""
    kind, _, argument = cascade.when.partition(":")
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


def pending_review(task_id: str, model: str, version: str) -> dict[str, str]:
    """A review's entry in the reviewed task's record until it ends: the review's finish finds
    it by these exact bytes (``orjson.dumps``) and writes its end in its place."""
    review = {"status": "PENDING", "task_id": task_id, "model": model}
    if version:
        review["model_version"] = version
    return review
