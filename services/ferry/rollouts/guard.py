"""The guard's decision for a rollout: roll back, step the candidate's share up, promote, or
hold. Pure code, no I/O: the figures are the stable's and the candidate's since the share last
changed (``window``), the clock is passed in.

Roll back at once when the candidate's circuit breaker is open in every batcher (its calls keep
failing: it gets no more traffic until it is rolled back, so the request count would never
come); or when, over at least ``min_requests`` of the candidate's requests, its error rate
passes the stable's by more than ``max_error_increase``; or when its typical Triton call at
like batch sizes passes ``max_latency_ratio`` times the stable's, times the stable's own noise,
and is ``latency_slack_ms`` slower (``rollouts.latency``: medians per size class, at least
``latency.MIN_CALLS`` calls, shadows apart). Queue time is reported, not judged: a candidate
with a small share fills its batches more slowly, so it waits longer for reasons that are not
its own; p99s are reported, not judged: a few dozen calls' p99 is one slow moment of the
machine. Step up when the share has held ``hold_s`` over at least ``min_requests``; a step to
100% is the promotion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ferry.rollouts import latency
from ferry.rollouts.rollout import Rollout
from ferry.rollouts.window import Figures

Action = Literal["rollback", "step", "promote", "hold"]


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    share: float  # the candidate's share after the decision


def decide(rollout: Rollout, stable: Figures, candidate: Figures, now: float,
           candidate_breaker: str = "closed") -> Decision:
    """What the guard does with ``rollout`` now (``candidate_breaker``: the candidate's
    circuit breaker as the gateways see it)."""
    if rollout.live and rollout.auto and candidate_breaker == "open":
        return Decision("rollback", f"candidate's circuit breaker is open (its calls keep "
                        f"failing: {candidate.errors} errors in {candidate.requests} requests "
                        "since the share changed)", 0.0)
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
    slower = latency.compare(stable.calls, candidate.calls, stable.buckets)
    if slower is None:
        return ""  # too few like calls to judge latency
    limit = rollout.max_latency_ratio * slower.noise
    if slower.ratio > limit and slower.excess_s * 1000 > rollout.latency_slack_ms:
        return (f"{slower.describe()} > {rollout.max_latency_ratio:g} x the noise and "
                f"{rollout.latency_slack_ms:g} ms slower")
    return ""


def _healthy(stable: Figures, candidate: Figures) -> str:
    compared = latency.compare(stable.calls, candidate.calls, stable.buckets)
    calls = (f"median call {compared.ratio:.2f}x the stable's at the same batch sizes"
             if compared is not None else f"{candidate.calls.calls} calls, too few to compare")
    return (f"candidate {candidate.requests} requests, errors {candidate.error_rate:.2%} "
            f"(stable {stable.error_rate:.2%}), {calls}; Triton p99 "
            f"{candidate.triton_p99_s * 1000:.1f} ms (stable {stable.triton_p99_s * 1000:.1f} "
            "ms)")
