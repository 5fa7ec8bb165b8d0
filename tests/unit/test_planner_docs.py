"""The docs show what ``ferry plan size`` prints for the design scenario (docs/cli.md's command):
its answer word for word in docs/cli.md and PLANNER.md, its progress off a terminal, the runs
and figures docs/cli.md's prose quotes, and its Redis rows in docs/redis.md. The scenario runs
once, as the command (about 20 s on this project's 2-core machine, the most of this file);
the SLO example's figures are checked where it is sized (test_planner.py)."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ferry.cli import main
from ferry.planner import arrivals, command, headroom
from ferry.planner import search as search_module
from ferry.planner.deployment import Bound, Deployment, Outcome
from ferry.planner.memory import RedisSizes, byte_size, human, redis_memory
from ferry.planner.search import Sizing, envelope
from ferry.planner.simulate import simulate
from ferry.planner.validate import DESIGN_SCENARIO

ROOT = Path(__file__).resolve().parents[2]
CLI_DOC, REDIS_DOC, PLANNER_DOC = ROOT / "docs" / "cli.md", ROOT / "docs" / "redis.md", \
    ROOT / "PLANNER.md"
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
ELAPSED = re.compile(r", \d+ s$")  # a progress line's seconds since the start
STALE = f"paste what `{' '.join(DESIGN_SCENARIO)}` prints"


@dataclass(frozen=True)
class Run:
    deployment: Deployment
    seed: int
    outcome: Outcome


@dataclass(frozen=True)
class Design:
    """What the design scenario printed, and what it sized and ran to print it."""

    stdout: str
    stderr: str
    sizing: Sizing
    runs: list[Run]


@pytest.fixture(scope="module")
def design() -> Design:
    sizings: list[Sizing] = []
    runs: list[Run] = []
    sizing, simulating = search_module.size, simulate

    def recording_size(*args: Any, **kwargs: Any) -> Sizing:
        sizings.append(sizing(*args, **kwargs))
        return sizings[-1]

    def recording_simulate(cost: Any, deployment: Deployment, load: Sequence[float],
                           seed: int = 0, warmup_s: float | None = None, *,
                           bound: Bound | None = None, shadow_slo_s: float = 0.0) -> Outcome:
        outcome = simulating(cost, deployment, load, seed, warmup_s, bound=bound,
                             shadow_slo_s=shadow_slo_s)
        runs.append(Run(deployment, seed, outcome))
        return outcome

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(command, "size", recording_size)
        patch.setattr(search_module, "simulate", recording_simulate)
        with redirect_stdout(out), redirect_stderr(err):
            assert main(list(DESIGN_SCENARIO[1:])) == 0
    return Design(out.getvalue().rstrip("\n"), err.getvalue(), sizings[0], runs)


def fenced(path: Path) -> list[str]:
    """The page's code blocks, without their fences."""
    return [block.rstrip("\n") for block in FENCE.findall(path.read_text())]


def prose(path: Path) -> str:
    """The page with its lines joined and its spaces single, as a sentence reads."""
    return " ".join(path.read_text().split())


def test_the_docs_show_the_design_scenarios_answer_word_for_word(design: Design) -> None:
    assert design.stdout.startswith("Ferry plan: 10,000/s with p99 < 500 ms")
    assert design.stdout in fenced(CLI_DOC), f"docs/cli.md is stale: {STALE}"
    assert design.stdout in fenced(PLANNER_DOC), "PLANNER.md is stale: make plan-check"


def test_the_docs_show_the_progress_a_pipe_gets(design: Design) -> None:
    """Off a terminal: a line each time the sizing moves on, one at the end, nothing on
    stdout but the answer (the seconds differ from run to run)."""
    shown = [block for block in fenced(CLI_DOC) if block.startswith("searching: 1 of")]
    assert len(shown) == 1
    got = design.stderr.rstrip("\n").splitlines()
    assert [ELAPSED.sub("", line) for line in shown[0].splitlines()] == [
        ELAPSED.sub("", line) for line in got], f"docs/cli.md is stale: {STALE} 2>&1 >/dev/null"
    assert "searching" not in design.stdout


def test_the_prose_quotes_the_answer_and_the_runs_that_chose_it(design: Design) -> None:
    s, doc = design.sizing, prose(CLI_DOC)
    d, target = s.deployment, s.target
    assert (f"So {d.instances} GPU instances rather than {s.envelope_instances}: the envelope's "
            f"{s.envelope_instances} would run at 98% of their full-batch capacity") in doc
    assert (f"laid out as {d.replicas} Triton replicas of {d.instances_per_replica} instance "
            f"each") in doc
    assert (f"{d.batchers} batchers, {s.gateways} gateway processes and a Redis Cluster of "
            f"{s.redis_shards} masters") in doc
    # The search's runs of 38 and 39 instances (either wait) missed the target; 40 met it with
    # a 50 ms wait and missed it with 10 ms; the headroom's third run of 40 did not hold it,
    # and 42, its first growth by 5%, held it on all three (and on the figures' run)
    searched = {n: {r.deployment.max_wait_s: r.outcome for r in design.runs
                    if r.seed == 0 and r.deployment.instances == n and not r.deployment.slo_s}
                for n in (38, 39, 40)}
    assert all(len(runs) == 2 and all(o.stopped for o in runs.values())
               for runs in (searched[38], searched[39]))
    assert searched[40][0.01].stopped and not searched[40][0.05].stopped
    assert d.instances == 42 and d.max_wait_s == 0.05
    assert ("found 38 and 39 instances (38: the capacity bound at 12,000/s) missing the p99 on "
            f"its run, and 40 meeting it with a 50 ms wait, at "
            f"{round(searched[40][0.05].p99_s * 1e3)} ms, but not with a 10 ms wait (its p99 "
            f"{round(searched[40][0.01].p99_s * 1e3)} ms when it stopped): so 50 ms") in doc
    forty = [r for r in design.runs if r.deployment.instances == 40 and not r.deployment.slo_s
             and r.deployment.max_wait_s == d.max_wait_s]
    assert [(r.seed, r.outcome.stopped) for r in forty] == [(0, False), (1, False), (2, True)]
    assert ("the third run of 40 went past what the promise allows (its p99 "
            f"{round(forty[2].outcome.p99_s * 1e3)} ms when it stopped), so it grew") in doc
    chosen = [r for r in design.runs if r.deployment.instances == d.instances
              and not r.deployment.slo_s and r.deployment.max_wait_s == d.max_wait_s]
    assert [(r.seed, r.outcome.stopped) for r in chosen] == [(0, False), (1, False), (2, False),
                                                             (3, False)]  # 3: the figures'
    assert envelope(s.cost, target.design_qps, d.max_batch) == 38
    p99s = sorted(round(p99 * 1e3) for p99 in s.design_p99s)
    bound = s.design_bound_s
    assert (f"Here that is {d.instances} instances, whose three runs give {p99s[0]} to "
            f"{p99s[-1]} ms and promise {bound * 1e3:.0f} ms, "
            f"{1 - bound / target.p99_s:.0%} under the target") in doc
    assert f"Student's t for 2 degrees of freedom ({headroom.T95[2]:.2f})" in doc
    assert (f"in the design scenario 16 and 32, which need "
            f"{envelope(s.cost, target.design_qps, 16)} and "
            f"{envelope(s.cost, target.design_qps, 32)} instances at full batches") in doc
    searched_runs = next(i for i, r in enumerate(design.runs) if r.seed)
    assert (f"({s.candidates} runs of 20 simulated seconds at 12,000 or 10,000/s: "
            f"{searched_runs} in the search, {s.candidates - searched_runs - 2} in the "
            "headroom's check") in doc


def test_a_fourth_run_of_the_answer_holds_the_target(design: Design) -> None:
    """The headroom's promise, on arrivals none of its runs had: the answer at the design
    load holds the p99."""
    s = design.sizing
    seed = s.target.seed + s.target.headroom_runs
    load = arrivals.poisson(s.target.design_qps, s.target.check_seconds, seed)
    assert simulate(s.cost, s.deployment, load, seed=seed).p99_s <= s.target.p99_s


def test_docs_redis_shows_the_design_scenarios_memory(design: Design) -> None:
    text = REDIS_DOC.read_text()
    rows = [line for line in design.stdout.splitlines() if line.startswith("Redis memory")]
    assert len(rows) == 2
    for row in rows:
        assert f"    {row}\n" in text, f"docs/redis.md is stale: {STALE}"
    big = RedisSizes(payload_bytes=byte_size("200K"))
    load, _ = command.redis_loads(design.sizing, big)
    memory = redis_memory(load)
    assert (f"With 200 KB payloads, the same deployment needs {human(memory.total)}, "
            f"{human(memory.unfinished)} of it the {load.unfinished:,} tasks") in prose(REDIS_DOC)
