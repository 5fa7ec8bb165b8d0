"""A model's rollout: its stable version, a candidate beside it, the candidate's share of
traffic, and the rules its guard applies. Pure code, no I/O.

The split is sticky: a request's key (its client id, or a key it names) hashes to a bucket in
[0, 10000); the candidate answers the buckets below its share. Raising the share keeps every
key that was on the candidate there, and a new candidate reshuffles the keys (its version is
in the hash). A request with no key is split at random.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from ferry.errors import BadRequestError, ConfigError
from ferry.rollouts.compare import Comparison

State = Literal["canary", "promoted", "rolled_back", "stable"]
STATES: tuple[State, ...] = ("canary", "promoted", "rolled_back", "stable")
STICKY = ("client", "key", "none")
BUCKETS = 10_000
DEFAULT_STEPS = (5.0, 25.0, 50.0, 100.0)
MAX_VERSION_DIGITS = 18
# What a declaration does not set (the rollout's own record of its trial), and the fields that
# declare a trial anew.
UNDECLARED = ("state", "since", "generation", "updated_at", "previous")
TRIAL = ("stable", "candidate", "share")
Role = Literal["stable", "candidate", "pinned", "policy"]


@dataclass(frozen=True)
class Sticky:
    """What a request may be split by: its client id and the rollout key it names."""

    client_id: str = ""
    rollout_key: str = ""

    def key(self, sticky: str) -> str:
        """The key for a rollout's ``sticky``: ``client`` the rollout key, else the client id;
        ``key`` the rollout key only; ``none`` none ('' : the request is split at random)."""
        if sticky == "client":
            return self.rollout_key or self.client_id
        return self.rollout_key if sticky == "key" else ""


@dataclass(frozen=True)
class Pick:
    """The version a request goes to ('': Triton's version policy picks), and why."""

    version: str
    role: Role


@dataclass(frozen=True)
class Rollout:
    """One model's versions as Ferry serves them; ``generation`` counts its changes."""

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
    compare: Mapping[str, Any] = field(default_factory=dict)  # see ``compare.Comparison``
    state: State = "stable"
    since: float = 0.0  # when the share last changed (Unix seconds)
    previous: str = ""  # the stable version before the last promotion
    generation: int = 0
    updated_at: float = 0.0

    @property
    def live(self) -> bool:
        """Whether a candidate is being tried (the guard watches it)."""
        return self.state == "canary" and bool(self.candidate)

    def pick(self, key: str, rand: float | None = None) -> Pick:
        """The version for a request whose sticky key is ``key`` ('' : none, split at random)."""
        if not self.live or self.share <= 0:
            return Pick(self.stable, "stable") if self.stable else Pick("", "policy")
        if key and self.sticky != "none":
            digest = hashlib.sha256(f"{self.model}\0{self.candidate}\0{key}".encode()).digest()
            bucket = int.from_bytes(digest[:8], "big") % BUCKETS
        else:
            bucket = int((random.random() if rand is None else rand) * BUCKETS)
        if bucket < round(self.share * BUCKETS / 100):
            return Pick(self.candidate, "candidate")
        return Pick(self.stable, "stable") if self.stable else Pick("", "policy")

    def shadowed_version(self, version: str, rand: float) -> bool:
        """Whether a request sent to ``version`` is also sent to the candidate (a share of the
        stable's requests, ``rand`` uniform in [0, 1))."""
        return (self.state == "canary" and bool(self.candidate) and self.shadow > 0
                and version == self.stable and rand * 100 < self.shadow)

    def next_share(self) -> float:
        """The guard's next step above the current share (100: promotion)."""
        return next((s for s in self.steps if s > self.share), 100.0)

    def changed(self, now: float, **fields: Any) -> Rollout:
        """This rollout with ``fields`` set, one generation on."""
        return dataclasses.replace(self, **fields, generation=self.generation + 1,
                                   updated_at=now)

    def promoted(self, now: float) -> Rollout:
        return self.changed(now, stable=self.candidate, candidate="", share=0.0,
                            state="promoted", since=now, previous=self.stable)

    def rolled_back(self, now: float) -> Rollout:
        return self.changed(now, share=0.0, state="rolled_back", since=now)

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["steps"] = list(self.steps)
        doc["compare"] = dict(self.compare)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], model: str | None = None) -> Rollout:
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


def check(rollout: Rollout) -> None:
    """Refuse a rollout that cannot be served (a 400 naming the field)."""
    Comparison.from_json(rollout.compare)  # its own 400: the keeper reads it every round
    problems = [*_version_problems(rollout), *_rule_problems(rollout)]
    if problems:
        raise BadRequestError("invalid_rollout", f"rollout of {rollout.model!r}: "
                              + "; ".join(problems))


def _version_problems(rollout: Rollout) -> list[str]:
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


def _rule_problems(rollout: Rollout) -> list[str]:
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


def declared(model: str, doc: Mapping[str, Any], now: float) -> Rollout:
    """A rollout as settings or the admin API declare it (a 400 naming what is wrong): a
    candidate makes it a canary."""
    rollout = _declared(model, doc, now)
    if "steps" in doc:  # a stored rollout's steps are not judged again: only those sent
        _check_steps(rollout)
    return rollout


def amended(before: Rollout | None, doc: Mapping[str, Any], now: float, model: str) -> Rollout:
    """``before`` with the fields ``doc`` sends, the others kept (no rollout yet: the
    defaults). Sending ``stable``, ``candidate`` or ``share`` declares the trial anew (a
    candidate makes it a canary, the share held from now); otherwise the trial goes on as it
    was: its state, since when its share holds, its previous stable version."""
    if before is None:
        return declared(model, doc, now)
    kept = {k: v for k, v in before.to_json().items() if k not in UNDECLARED}
    rollout = _declared(model, {**kept, **doc}, now)
    if "steps" in doc:
        _check_steps(rollout)
    if any(name in doc for name in TRIAL):
        return rollout
    return dataclasses.replace(rollout, state=before.state, since=before.since,
                               previous=before.previous)


def _declared(model: str, doc: Mapping[str, Any], now: float) -> Rollout:
    rollout = Rollout.from_json({k: v for k, v in doc.items() if k not in UNDECLARED}, model)
    state: State = "canary" if rollout.candidate else "stable"
    return dataclasses.replace(rollout, state=state, since=now, updated_at=now)


def _check_steps(rollout: Rollout) -> None:
    problems = step_problems(rollout.steps)
    if problems:
        raise BadRequestError("invalid_rollout", f"rollout of {rollout.model!r}: "
                              + "; ".join(problems))


def parse_declared(spec: str) -> dict[str, dict[str, Any]]:
    """The rollouts a settings value declares: a JSON object, model to rollout fields."""
    if not spec.strip():
        return {}
    try:
        doc = orjson.loads(spec)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"rollouts is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise ConfigError("rollouts must be a JSON object: {model: {stable, candidate, share, "
                          "...}}")
    for model, fields in doc.items():
        try:
            declared(model, fields, 0.0)
        except BadRequestError as exc:
            raise ConfigError(exc.message) from None
    return doc
