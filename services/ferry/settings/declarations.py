"""What a model's rollout and cascade declare: the records the ``rollouts`` and ``cascades``
settings are parsed into, and the rules they obey (the admin API's declarations obey the same
ones). Pure code, no I/O.

``ferry.rollouts`` builds on these records: ``Rollout`` (the split, the guard's steps) extends
``RolloutRecord``, ``compare`` compares by a ``Comparison``, ``wants_review`` reads a
``Cascade``. They live here, below it, because the settings check them when they are built and
import no feature."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import orjson

from ferry.errors import BadRequestError, ConfigError

State = Literal["canary", "promoted", "rolled_back", "stable"]
STATES: tuple[State, ...] = ("canary", "promoted", "rolled_back", "stable")
STICKY = ("client", "key", "none")
DEFAULT_STEPS = (5.0, 25.0, 50.0, 100.0)
MAX_VERSION_DIGITS = 18
# What a declaration does not set: the rollout's own record of its trial.
UNDECLARED = ("state", "since", "generation", "updated_at", "previous")
KINDS = ("auto", "tensors", "moderation", "labels", "equal")  # of a comparison
CONDITIONS = ("always", "unsafe", "label_above:<score>", "labels:<a,b,...>")  # of a review


def _json_object(setting: str, spec: str, shape: str) -> dict[str, Any]:
    """The JSON object a setting's text holds ({} for a blank one); a ``ConfigError`` naming
    ``setting`` if it is not JSON, or not an object (``shape`` says what it should be)."""
    if not spec.strip():
        return {}
    try:
        doc = orjson.loads(spec)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{setting} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{setting} must be a JSON object: {shape}")
    return doc


# --- rollouts ---------------------------------------------------------------------------------

def parse_declared(spec: str) -> dict[str, dict[str, Any]]:
    """The rollouts a settings value declares: a JSON object, model to rollout fields."""
    shape = "{model: {stable, candidate, share, ...}}"
    doc = _json_object("rollouts", spec, shape)
    if not all(isinstance(v, dict) for v in doc.values()):
        raise ConfigError(f"rollouts must be a JSON object: {shape}")
    for model, fields in doc.items():
        try:
            record = RolloutRecord.from_json(undeclared_dropped(fields), model)
            if "steps" in fields:
                check_steps(record)
        except BadRequestError as exc:
            raise ConfigError(exc.message) from None
    return doc


def undeclared_dropped(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A declaration's fields, less those a declaration does not set (``UNDECLARED``)."""
    return {k: v for k, v in doc.items() if k not in UNDECLARED}


@dataclass(frozen=True)
class Comparison:
    """How a shadow's answer is compared with the primary's (a rollout's ``compare``)."""

    kind: str = "auto"
    score: float = 0.0  # labels scoring below this are left out
    atol: float = 1e-5
    rtol: float = 1e-3

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Comparison:
        unknown = set(doc) - {"kind", "score", "atol", "rtol"}
        kind = str(doc.get("kind", "auto"))
        if unknown or kind not in KINDS:
            raise BadRequestError("invalid_rollout", f"compare takes kind (one of "
                                  f"{', '.join(KINDS)}), score, atol and rtol; got {dict(doc)}")
        try:
            return cls(kind, float(doc.get("score", 0.0)), float(doc.get("atol", 1e-5)),
                       float(doc.get("rtol", 1e-3)))
        except (TypeError, ValueError):
            raise BadRequestError("invalid_rollout", "compare's score, atol and rtol are "
                                  "numbers") from None


@dataclass(frozen=True)
class RolloutRecord:
    """One model's versions as declared and stored: its fields, their JSON, and the rules they
    obey (``ferry.rollouts.rollout.Rollout`` adds what a rollout does); ``generation`` counts
    its changes."""

    model: str
    stable: str = ""
    candidate: str = ""
    share: float = 0.0  # percent of requests the candidate answers, 0 to 100
    sticky: str = "client"  # the key a request is split by: client id, its own key, or none
    shadow: float = 0.0  # percent of the stable's requests also sent to the candidate
    auto: bool = True  # the guard steps the share up, promotes and rolls back by itself
    steps: tuple[float, ...] = DEFAULT_STEPS
    hold_s: float = 60.0  # how long a share must hold before the next step
    min_requests: int = 200  # the candidate's requests a decision needs
    max_error_increase: float = 0.01  # candidate error rate may exceed the stable's by this
    max_latency_ratio: float = 1.5  # candidate Triton p99 may be this times the stable's ...
    latency_slack_ms: float = 5.0  # ... plus this
    compare: Mapping[str, Any] = field(default_factory=dict)  # see ``Comparison``
    state: State = "stable"
    since: float = 0.0  # when the share last changed (Unix seconds)
    previous: str = ""  # the stable version before the last promotion
    generation: int = 0
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["steps"] = list(self.steps)
        doc["compare"] = dict(self.compare)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], model: str | None = None) -> Self:
        """A rollout from its JSON (a stored one, or a declaration: a 400 says what is wrong)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise BadRequestError("invalid_rollout", f"unknown rollout field(s): "
                                  f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = {k: v for k, v in doc.items() if k in known}
        if model is not None:
            values["model"] = model
        try:
            rollout = cls(**_typed(values))
        except (TypeError, ValueError) as exc:
            raise BadRequestError("invalid_rollout", f"rollout: {exc}") from None
        check(rollout)
        return rollout


FLOATS = ("share", "shadow", "hold_s", "max_error_increase", "max_latency_ratio",
          "latency_slack_ms", "since", "updated_at")


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """JSON's numbers and lists as the fields' types."""
    values |= {name: _number(values[name], name) for name in FLOATS if name in values}
    values |= {name: int(_number(values[name], name)) for name in ("min_requests", "generation")
               if name in values}
    values |= {name: str(values[name]) for name in ("stable", "candidate", "previous")
               if values.get(name) is not None}
    if "steps" in values:
        if not isinstance(values["steps"], list | tuple):
            raise ValueError("steps must be a list of percentages")
        values["steps"] = tuple(_number(s, "steps") for s in values["steps"])
    if "compare" in values and not isinstance(values["compare"], dict):
        raise ValueError("compare must be an object")
    if "auto" in values and not isinstance(values["auto"], bool):
        raise ValueError("auto must be true or false")
    return values


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} must be a number, not {value!r}")
    try:
        return float(value)
    except ValueError:  # a string that is no number: named, not Python's own words
        raise ValueError(f"{name} must be a number, not {str(value)[:40]!r}") from None


def check(rollout: RolloutRecord) -> None:
    """Refuse a rollout that cannot be served (a 400 naming the field)."""
    Comparison.from_json(rollout.compare)  # its own 400: the keeper reads it every round
    problems = [*_version_problems(rollout), *_rule_problems(rollout)]
    if problems:
        raise BadRequestError("invalid_rollout", f"rollout of {rollout.model!r}: "
                              + "; ".join(problems))


def _version_problems(rollout: RolloutRecord) -> list[str]:
    problems = []
    for name in ("stable", "candidate", "previous"):
        version = getattr(rollout, name)
        if version and not (version.isascii() and version.isdigit()
                            and len(version) <= MAX_VERSION_DIGITS):
            problems.append(f"{name} must be a version number, not {version[:40]!r}")
    if not rollout.model:
        problems.append("model is required")
    if rollout.candidate and rollout.candidate == rollout.stable:
        problems.append("candidate must differ from stable")
    if rollout.candidate and not rollout.stable:
        problems.append("a candidate needs a stable version beside it")
    return problems


def _rule_problems(rollout: RolloutRecord) -> list[str]:
    problems = []
    if not 0 <= rollout.share <= 100 or not 0 <= rollout.shadow <= 100:
        problems.append("share and shadow are percentages, 0 to 100")
    if rollout.sticky not in STICKY:
        problems.append(f"sticky must be one of {', '.join(STICKY)}")
    if rollout.state not in STATES:
        problems.append(f"state must be one of {', '.join(STATES)}")
    if not rollout.steps or any(not 0 < s <= 100 for s in rollout.steps):
        problems.append("steps must be one or more percentages above 0, at most 100")
    if rollout.hold_s < 0 or rollout.min_requests < 1 or rollout.max_latency_ratio < 1:
        problems.append("hold_s must be >= 0, min_requests >= 1, max_latency_ratio >= 1")
    return problems


def step_problems(steps: Sequence[float]) -> list[str]:
    """What is wrong with declared steps: each a percentage above 0 and at most 100, each above
    the one before (as given: an admin's order is never silently changed), the last 100."""
    if not steps:
        return ["steps must list at least one share; the last step must be 100 (reaching it "
                "promotes the candidate)"]
    listed = ", ".join(f"{s:g}" for s in steps)
    problems = []
    if any(not 0 < s <= 100 for s in steps):
        problems.append(f"steps must be percentages above 0, at most 100: {listed} are not")
    if any(later <= earlier for earlier, later in itertools.pairwise(steps)):
        problems.append(f"steps must rise, each above the one before: {listed} do not")
    if steps[-1] != 100:
        problems.append(f"the last step must be 100 (reaching it promotes the candidate), "
                        f"not {steps[-1]:g}")
    return problems


def check_steps(rollout: RolloutRecord) -> None:
    """Refuse the steps a declaration sends unless they rise to 100 (a 400 naming them); a
    stored rollout's steps are not judged again."""
    problems = step_problems(rollout.steps)
    if problems:
        raise BadRequestError("invalid_rollout", f"rollout of {rollout.model!r}: "
                              + "; ".join(problems))


# --- cascades ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cascade:
    """A model whose answers a second model reviews, and when (``CONDITIONS``)."""

    model: str
    review_model: str
    review_version: str = ""
    when: str = "always"


def parse_cascades(spec: str) -> dict[str, Cascade]:
    """The cascades a JSON object declares (``ConfigError`` saying what is wrong)."""
    doc = _json_object("cascades", spec, "{model: {review_model, when}}")
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
