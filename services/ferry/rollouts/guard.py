"""The guard's decision for a rollout: roll back, step the candidate's share up, promote, or
hold. Pure code, no I/O: the figures are the stable's and the candidate's since the share last
changed (``window``), the clock is passed in.

Roll back at once when, over at least ``min_requests`` of the candidate's requests, its error
rate passes the stable's by more than ``max_error_increase``, or its Triton p99 passes
``max_latency_ratio`` times the stable's plus ``latency_slack_ms``. Queue time is reported, not
judged: a candidate with a small share fills its batches more slowly, so it waits longer for
reasons that are not its own. Step up when the share has held ``hold_s`` over at least
``min_requests``; a step to 100% is the promotion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ferry.rollouts.rollout import Rollout
from ferry.rollouts.window import Figures

Action = Literal["rollback", "step", "promote", "hold"]


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    share: float  # the candidate's share after the decision


def decide(rollout: Rollout, stable: Figures, candidate: Figures, now: float) -> Decision:
    """What the guard does with ``rollout`` now."""
    waiting = _waiting(rollout, candidate)
    if waiting:
        return Decision("hold", waiting, rollout.share)
    failing = _failing(rollout, stable, candidate)
    if failing:
        return Decision("rollback", failing, 0.0)
    held = now - rollout.since
    if held < rollout.hold_s:
        return Decision("hold", f"{rollout.share:g}% has held {held:.0f} of {rollout.hold_s:g} s",
                        rollout.share)
    share = rollout.next_share()
    healthy = _healthy(stable, candidate)
    if share >= 100:
        return Decision("promote", f"{rollout.share:g}% held {held:.0f} s: {healthy}", 100.0)
    return Decision("step", f"{rollout.share:g}% held {held:.0f} s: {healthy}", share)


def _waiting(rollout: Rollout, candidate: Figures) -> str:
    """Why the guard cannot decide yet ('' : it can)."""
    if not rollout.live:
        return f"no candidate is being tried ({rollout.state})"
    if not rollout.auto:
        return "manual rollout: the guard only reports"
    if candidate.requests < rollout.min_requests:
        return (f"{candidate.requests} of the {rollout.min_requests} candidate requests a "
                "decision needs")
    return ""


def _failing(rollout: Rollout, stable: Figures, candidate: Figures) -> str:
    """Why the candidate fails against the stable ('' : it does not)."""
    allowed = stable.error_rate + rollout.max_error_increase
    if candidate.error_rate > allowed:
        return (f"candidate error rate {candidate.error_rate:.2%} over {candidate.requests} "
                f"requests > stable's {stable.error_rate:.2%} + {rollout.max_error_increase:.2%}")
    if stable.requests == 0 or stable.triton_p99_s <= 0:
        return ""  # nothing to compare latency with
    limit_s = stable.triton_p99_s * rollout.max_latency_ratio + rollout.latency_slack_ms / 1000
    if candidate.triton_p99_s > limit_s:
        return (f"candidate Triton p99 {candidate.triton_p99_s * 1000:.1f} ms > "
                f"{rollout.max_latency_ratio:g} x stable's "
                f"{stable.triton_p99_s * 1000:.1f} ms + {rollout.latency_slack_ms:g} ms")
    return ""


def _healthy(stable: Figures, candidate: Figures) -> str:
    return (f"candidate {candidate.requests} requests, errors {candidate.error_rate:.2%} "
            f"(stable {stable.error_rate:.2%}), Triton p99 {candidate.triton_p99_s * 1000:.1f} "
            f"ms (stable {stable.triton_p99_s * 1000:.1f} ms)")
