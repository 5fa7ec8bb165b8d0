"""Rollouts in Redis: each model's rollout (changed only by a script that checks its
generation, so two writers never overwrite each other's change unseen), its decisions' log,
the per-version figures batchers tally, and the shadow comparison's pairs and figures.

``apply_declared`` writes the rollouts the settings declare, when the declaration changes (a
rollout an admin changed since is left as it is until the declaration itself changes)."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

import orjson

from ferry import keys, lua
from ferry.resp.client import Commands
from ferry.rollouts.compare import Verdict
from ferry.rollouts.rollout import Rollout, declared
from ferry.rollouts.window import BUCKET_S, Figures, Key, buckets_between, figures


class ChangeKeys(NamedTuple):
    rollouts: str
    generations: str
    log: str  # the model's decisions


class ChangeArgs(NamedTuple):
    model: str
    expected: int  # the generation the writer read (-1: any)
    rollout: bytes  # JSON
    generation: int
    entry: bytes  # the log entry, JSON


class Change(IntEnum):
    """What the change script did."""

    STORED = 1
    STALE = 0  # another change came first: nothing written


CHANGE = lua.ScriptSpec("ferry.rollouts", "change", ChangeKeys._fields, ChangeArgs._fields,
                        results=(Change, "CHANGE_"),
                        constants=(("LOG_LENGTH", keys.ROLLOUT_LOG_LENGTH),))


@dataclass(frozen=True)
class Pair:
    """A request's task and its shadow's, and the candidate version the shadow asked for."""

    primary: str
    shadow: str
    candidate: str

    @property
    def member(self) -> str:
        return f"{self.primary} {self.shadow} {self.candidate}"

    @classmethod
    def parse(cls, member: str) -> Pair:
        primary, shadow, candidate = ([*member.split(" "), "", ""])[:3]
        return cls(primary, shadow, candidate)


def declaration_digest(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()


class RolloutStore:
    """Rollouts, their log, and the figures the guard and ``ferry rollout`` read."""

    def __init__(self, client: Commands) -> None:
        self.client = client
        self._change = client.register_script(lua.source(CHANGE))

    async def all(self) -> dict[str, Rollout]:
        flat = await self.client.execute("HGETALL", keys.ROLLOUTS)
        found = {}
        for i in range(0, len(flat or []), 2):
            model = flat[i].decode()
            found[model] = Rollout.from_json(orjson.loads(flat[i + 1]), model)
        return found

    async def get(self, model: str) -> Rollout | None:
        raw = await self.client.execute("HGET", keys.ROLLOUTS, model)
        return Rollout.from_json(orjson.loads(raw), model) if raw else None

    async def change(self, before: Rollout | None, after: Rollout, entry: Mapping[str, Any]
                     ) -> bool:
        """Store ``after`` if the stored rollout is still ``before`` (None: whatever it is),
        with ``entry`` in its log; False if another change came first."""
        expected = -1 if before is None else before.generation
        done = await self.client.execute(*self._change.command(
            ChangeKeys(rollouts=keys.ROLLOUTS, generations=keys.ROLLOUT_GENERATIONS,
                       log=keys.rollout_log_key(after.model)),
            ChangeArgs(model=after.model, expected=expected,
                       rollout=orjson.dumps(after.to_json()), generation=after.generation,
                       entry=orjson.dumps({**entry, "generation": after.generation}))))
        return Change(int(done)) is Change.STORED

    async def remove(self, model: str, entry: Mapping[str, Any]) -> bool:
        removed = await self.client.pipeline([
            ("HDEL", keys.ROLLOUTS, model), ("HDEL", keys.ROLLOUTS_DECLARED, model),
            ("HDEL", keys.ROLLOUT_CHECKS, model),
            ("LPUSH", keys.rollout_log_key(model), orjson.dumps(entry))])
        return bool(removed[0])

    async def declared(self, model: str) -> str:
        raw = await self.client.execute("HGET", keys.ROLLOUTS_DECLARED, model)
        return raw.decode() if raw else ""

    async def mark_declared(self, model: str, digest: str) -> None:
        await self.client.execute("HSET", keys.ROLLOUTS_DECLARED, model, digest)

    async def note_check(self, model: str, look: Mapping[str, Any]) -> None:
        """The guard's last look at a model's rollout (what ``ferry rollout status`` shows)."""
        await self.client.execute("HSET", keys.ROLLOUT_CHECKS, model, orjson.dumps(look))

    async def last_check(self, model: str) -> dict[str, Any] | None:
        raw = await self.client.execute("HGET", keys.ROLLOUT_CHECKS, model)
        return orjson.loads(raw) if raw else None

    async def log(self, model: str, count: int = 50) -> list[dict[str, Any]]:
        raw = await self.client.execute("LRANGE", keys.rollout_log_key(model), 0, count - 1)
        return [orjson.loads(entry) for entry in raw or []]

    # -- per-version figures ----------------------------------------------------------------------

    async def add_tally(self, drained: Mapping[Key, Mapping[str, int]]) -> None:
        """Add a batcher's tally into the buckets' hashes (kept ``VERSION_STATS_TTL_S``)."""
        commands: list[tuple[Any, ...]] = []
        for (model, version, bucket), fields in drained.items():
            key = keys.version_stats_key(model, version, bucket)
            commands += [("HINCRBY", key, name, count) for name, count in fields.items()]
            commands.append(("EXPIRE", key, keys.VERSION_STATS_TTL_S))
        if commands:
            await self.client.pipeline(commands)

    async def figures(self, model: str, version: str, since: float,
                      now: float | None = None) -> Figures:
        """One version's figures from ``since`` (at most an hour ago) to now."""
        now = time.time() if now is None else now
        start = max(since, now - keys.VERSION_STATS_TTL_S + BUCKET_S)
        commands = [("HGETALL", keys.version_stats_key(model, version, bucket))
                    for bucket in buckets_between(start, now)]
        replies = await self.client.pipeline(commands)
        return figures([{reply[i].decode(): int(reply[i + 1]) for i in range(0, len(reply), 2)}
                        for reply in replies if reply])

    # -- shadow pairs and comparisons --------------------------------------------------------------

    async def add_pair(self, model: str, pair: Pair, at: float) -> None:
        await self.client.execute("ZADD", keys.shadow_pairs_key(model), at, pair.member)

    async def pairs(self, model: str, count: int) -> list[tuple[Pair, float]]:
        """The oldest ``count`` pairs waiting, with when each was admitted."""
        raw = await self.client.execute("ZRANGE", keys.shadow_pairs_key(model), 0, count - 1,
                                        "WITHSCORES")
        return [(Pair.parse(raw[i].decode()), float(raw[i + 1]))
                for i in range(0, len(raw or []), 2)]

    async def settle_pairs(self, model: str, settled: Sequence[tuple[Pair, Verdict | str]]
                           ) -> None:
        """Forget compared pairs, adding their verdicts (or why a pair was skipped) into their
        candidate's figures and its disagreeing examples."""
        if not settled:
            return
        commands: list[tuple[Any, ...]] = [
            ("ZREM", keys.shadow_pairs_key(model), *(pair.member for pair, _ in settled))]
        for candidate in sorted({pair.candidate for pair, _ in settled}):
            commands += self._settled_of(model, candidate, settled)
        await self.client.pipeline(commands)
        for candidate in sorted({pair.candidate for pair, _ in settled}):
            await self._keep_largest(keys.comparison_key(model, candidate),
                                     [v for p, v in settled if p.candidate == candidate])

    def _settled_of(self, model: str, candidate: str,
                    settled: Sequence[tuple[Pair, Verdict | str]]) -> list[tuple[Any, ...]]:
        figures_key = keys.comparison_key(model, candidate)
        examples_key = keys.comparison_key(model, candidate, "examples")
        commands: list[tuple[Any, ...]] = []
        for pair, verdict in settled:
            if pair.candidate != candidate:
                continue
            primary, shadow = pair.primary, pair.shadow
            commands += _tallied(figures_key, examples_key, primary, shadow, verdict)
        commands.append(("LTRIM", examples_key, 0, keys.ROLLOUT_EXAMPLES - 1))
        return commands

    async def _keep_largest(self, key: str, settled: Sequence[Verdict | str]) -> None:
        verdicts = [v for v in settled if isinstance(v, Verdict) and v.kind == "tensors"]
        if not verdicts:
            return
        raw = await self.client.pipeline([("HGET", key, "max_abs"), ("HGET", key, "max_rel")])
        largest_abs = max([float(raw[0] or 0), *(v.max_abs for v in verdicts)])
        largest_rel = max([float(raw[1] or 0), *(v.max_rel for v in verdicts)])
        await self.client.execute("HSET", key, "max_abs", repr(largest_abs),
                                  "max_rel", repr(largest_rel))

    async def comparison(self, model: str, candidate: str) -> dict[str, Any]:
        """The candidate's comparison: counts, agreement, label distributions, examples."""
        flat, examples, waiting = await self.client.pipeline([
            ("HGETALL", keys.comparison_key(model, candidate)),
            ("LRANGE", keys.comparison_key(model, candidate, "examples"), 0, -1),
            ("ZCARD", keys.shadow_pairs_key(model))])
        fields = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat or []), 2)}
        return comparison_report(fields, [orjson.loads(e) for e in examples or []],
                                 int(waiting or 0))


def _tallied(figures_key: str, examples_key: str, primary: str, shadow: str,
             verdict: Verdict | str) -> list[tuple[Any, ...]]:
    if isinstance(verdict, str):
        return [("HINCRBY", figures_key, f"skipped:{verdict}", 1)]
    commands: list[tuple[Any, ...]] = [
        ("HINCRBY", figures_key, "compared", 1),
        ("HINCRBY", figures_key, "agreed", int(verdict.agree))]
    for side, labels in zip(("primary", "shadow"), verdict.labels, strict=True):
        commands.append(("HINCRBY", figures_key, f"answers:{side}", 1))
        commands += [("HINCRBY", figures_key, f"label:{side}:{label}", 1) for label in labels]
    for side, unsafe in zip(("primary", "shadow"), verdict.unsafe, strict=True):
        if unsafe:
            commands.append(("HINCRBY", figures_key, f"unsafe:{side}", 1))
    if not verdict.agree:
        commands.append(("LPUSH", examples_key, orjson.dumps({
            "primary_task_id": primary, "shadow_task_id": shadow, "detail": verdict.detail,
            "at": time.time()})))
    return commands


def comparison_report(fields: Mapping[str, str], examples: list[Any],
                      waiting: int) -> dict[str, Any]:
    """The comparison's figures as ``ferry rollout compare`` shows them."""
    compared = int(fields.get("compared", 0))
    agreed = int(fields.get("agreed", 0))
    report: dict[str, Any] = {
        "compared": compared, "agreed": agreed,
        "agreement": round(agreed / compared, 6) if compared else None,
        "waiting": waiting,
        "skipped": {name[8:]: int(value) for name, value in fields.items()
                    if name.startswith("skipped:")},
        "examples": examples}
    for side in ("primary", "shadow"):
        answers = int(fields.get(f"answers:{side}", 0))
        labels = {name.split(":", 2)[2]: int(value) for name, value in fields.items()
                  if name.startswith(f"label:{side}:")}
        report[f"labels_{side}"] = {
            "answers": answers, "unsafe": int(fields.get(f"unsafe:{side}", 0)),
            "share": {label: round(count / answers, 4) for label, count in sorted(labels.items())}
            if answers else {}}
    if "max_abs" in fields:
        report["max_abs_diff"] = float(fields["max_abs"])
        report["max_rel_diff"] = float(fields["max_rel"])
    return report


async def apply_declared(store: RolloutStore, declarations: Mapping[str, Mapping[str, Any]],
                         now: float | None = None) -> list[str]:
    """Write each declared rollout whose declaration changed since it was last written; the
    models written."""
    now = time.time() if now is None else now
    written = []
    for model, fields in declarations.items():
        digest = declaration_digest(fields)
        if await store.declared(model) == digest:
            continue
        before = await store.get(model)
        after = declared(model, fields, now)
        after = after.changed(now) if before is None else _after(before, after, now)
        entry = {"at": now, "action": "declare", "by": "settings", "reason": "the settings' "
                 "declaration changed", "share": after.share, "stable": after.stable,
                 "candidate": after.candidate}
        if await store.change(before, after, entry):
            await store.mark_declared(model, digest)
            written.append(model)
    return written


def _after(before: Rollout, after: Rollout, now: float) -> Rollout:
    """``after`` as the next generation of ``before``."""
    return dataclasses.replace(after, generation=before.generation + 1, updated_at=now)
