"""Does the rollout guard roll back an equal candidate on noise, and a slower one at once?

Issue 32's run, repeated: a model whose version 2 is version 1 (the same code and settings) and
whose version 3 takes 80 ms more per call; for each run, a rollout at a 5% share with 10%
shadows, 1,500 requests 64 at a time through ``Prefer: wait``, then the guard's next look.
Candidates alternate (2, 3, 2, 3, ...) on one stack with Ferry's default settings. For each
run: whether the guard rolled back and why, and what the old rule (candidate Triton p99 over
1.5 x the stable's + 5 ms) says of the same figures. Loopback only; every loop is bounded.

    .venv/bin/python -m loadtest.rollout_noise --runs 10 --out /tmp/rollout-noise.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from ferry.stack.up import bundled_repository
from loadtest.bench.stack import BenchStack

MODEL = "sim_twins"
TOKEN = secrets.token_urlsafe(24)  # the stack's own, for this run
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
ROLLOUT = {"stable": "1", "share": 5, "shadow": 10, "hold_s": 600}
GUARD_LOOK_S = 4.5  # two looks of the guard (FERRY_ROLLOUT_CHECK_S, 2 s) and a tally flush


@dataclass
class Run:
    candidate: str
    requests: int
    seconds: float
    rolled_back: bool
    reason: str
    candidate_requests: int
    ratio: float | None  # the guard's like-for-like ratio, and the stable's noise
    noise: float | None
    old_rule_rollback: bool  # candidate p99 > 1.5 x stable's + 5 ms, on the same figures
    candidate_p99_ms: float
    stable_p99_ms: float


def repository(target: Path) -> Path:
    """``sim`` with versions 1, 2 (the same) and 3 (80 ms more per call), 1 the default."""
    model = target / MODEL
    shutil.copytree(bundled_repository() / "sim", model, ignore=shutil.ignore_patterns(
        "__pycache__"))
    for version in ("2", "3"):
        shutil.copytree(model / "1", model / version)
    config = (model / "config.pbtxt").read_text().replace('name: "sim"', f'name: "{MODEL}"')
    fixed = float(re.findall(r'key: "fixed_ms" value: \{ string_value: "([0-9.]+)"', config)[0])
    config += ("version_policy: { all { } }\n"
               f'parameters: {{ key: "fixed_ms@3" value: {{ string_value: "{fixed + 80:g}" }} }}\n'
               'parameters: { key: "ferry_default_version" value: { string_value: "1" } }\n')
    (model / "config.pbtxt").write_text(config)
    return target


async def load(client: httpx.AsyncClient, count: int, parallel: int, run: int) -> None:
    """``count`` requests with distinct inputs and rollout keys, ``parallel`` at a time."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await client.post(f"/v1/inference?model={MODEL}", content=f"r{run}-{i}".encode(),
                              headers={"Content-Type": "text/plain", "Prefer": "wait=20",
                                       "X-Rollout-Key": f"user-{i}"})

    await asyncio.gather(*(worker() for _ in range(parallel)))


async def one_run(client: httpx.AsyncClient, candidate: str, count: int, index: int) -> Run:
    await client.delete(f"/v1/admin/rollouts/{MODEL}", headers=ADMIN)
    since = time.time()
    put = await client.put(f"/v1/admin/rollouts/{MODEL}", headers=ADMIN,
                           json={**ROLLOUT, "candidate": candidate})
    put.raise_for_status()
    started = time.monotonic()
    await load(client, count, 64, index)
    seconds = time.monotonic() - started
    await asyncio.sleep(GUARD_LOOK_S)
    state = (await client.get(f"/v1/admin/rollouts/{MODEL}", headers=ADMIN)).json()
    return judged(candidate, count, seconds, state, since)


def judged(candidate: str, count: int, seconds: float, state: dict[str, Any],
           since: float) -> Run:
    """The run's outcome from the rollout's status (decisions of earlier runs are left out)."""
    rolled = state["rollout"]["state"] == "rolled_back"
    decision: dict[str, Any] = next(
        (d for d in state["decisions"] if d.get("action") == "rollback"
         and d.get("at", 0) >= since), {})
    look: dict[str, Any] = decision or state.get("guard") or {}
    figures = look.get("figures", {})
    stable, mine = figures.get("stable", {}), figures.get("candidate", {})
    latency = figures.get("latency", {})
    old = (mine.get("requests", 0) >= 200 and stable.get("triton_p99_ms", 0) > 0
           and mine.get("triton_p99_ms", 0) > 1.5 * stable["triton_p99_ms"] + 5)
    return Run(candidate, count, round(seconds, 2), rolled, look.get("reason", ""),
               mine.get("requests", 0), latency.get("ratio"), latency.get("noise"), old,
               mine.get("triton_p99_ms", 0.0), stable.get("triton_p99_ms", 0.0))


def table(runs: list[Run]) -> str:
    lines = ["| run | candidate | rolled back | guard's ratio / noise | old p99 rule | "
             "candidate / stable p99 ms | reason |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        ratio = f"{r.ratio:.2f} / {r.noise:.2f}" if r.ratio is not None and r.noise else "-"
        lines.append(f"| {i} | {r.candidate} | {'yes' if r.rolled_back else 'no'} | {ratio} | "
                     f"{'rollback' if r.old_rule_rollback else 'hold'} | "
                     f"{r.candidate_p99_ms:.1f} / {r.stable_p99_ms:.1f} | {r.reason[:90]} |")
    return "\n".join(lines)


async def measure(url: str, runs: int, count: int) -> list[Run]:
    # Idle connections dropped before uvicorn's keep-alive (5 s) closes them under a request.
    limits = httpx.Limits(keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        return [await one_run(client, "2" if i % 2 == 0 else "3", count, i)
                for i in range(2 * runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each candidate")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=None, help="the runs as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferry-rollout-noise-") as folder:
        state = Path(folder)
        stack = BenchStack(state, repository(state / "models"),
                           gateway_overrides={"admin_token": TOKEN, "cache_ttl_s": 0})
        try:
            stack.start(MODEL)
            runs = asyncio.run(measure(stack.gateway_url, args.runs, args.requests))
        finally:
            stack.stop()
    print(table(runs))
    equal = [r for r in runs if r.candidate == "2"]
    slower = [r for r in runs if r.candidate == "3"]
    print(f"\nequal candidate rolled back in {sum(r.rolled_back for r in equal)} of {len(equal)} "
          f"runs (the old p99 rule: {sum(r.old_rule_rollback for r in equal)}); the one 80 ms "
          f"slower in {sum(r.rolled_back for r in slower)} of {len(slower)}")
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in runs], indent=2))


if __name__ == "__main__":
    main()
