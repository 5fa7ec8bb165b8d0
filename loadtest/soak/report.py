"""The soak's report: its figures as JSON, and the same read as a summary."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from loadtest.soak.ledger import Tracked, Verdicts
from loadtest.soak.memory import Sample, Trend

EXAMPLES = 20
GROWING_MIB_PER_MIN = 1.0  # a warm process's trend past this is flagged in the summary


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (any order); NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_by_minute(tasks: Iterable[Tracked]) -> list[dict[str, Any]]:
    """p50/p99/max of submit -> first final answer, per minute of submission (from the
    scheduled send time, so retries and waits count)."""
    minutes: dict[int, list[float]] = {}
    for task in tasks:
        if task.latency_s is not None:
            minutes.setdefault(int(task.scheduled_s // 60), []).append(task.latency_s * 1000)
    return [{"minute": m, "answered": len(v), "p50_ms": round(percentile(v, 50), 1),
             "p99_ms": round(percentile(v, 99), 1), "max_ms": round(max(v), 1)}
            for m, v in sorted(minutes.items())]


def submissions(tasks: list[Tracked], retries: Counter[str], refused: Counter[str],
                skipped: int) -> dict[str, Any]:
    return {"sent": len(tasks), "accepted": sum(t.task_id is not None for t in tasks),
            "retried_tasks": sum(len(t.attempts) > 1 for t in tasks),
            "retries": sum(retries.values()), "retry_causes": dict(retries.most_common()),
            "refused": sum(refused.values()), "refused_causes": dict(refused.most_common()),
            "skipped": skipped}


def verdicts_section(verdicts: Verdicts) -> dict[str, Any]:
    return {"accepted": verdicts.accepted, "finished": dict(verdicts.finished),
            "failure_reasons": dict(verdicts.reasons.most_common(10)),
            "lost": len(verdicts.lost),
            "lost_reasons": dict(Counter(r.split(" (")[0] for _, r in verdicts.lost)),
            "lost_by_submission_s": when(t for t, _ in verdicts.lost),
            "wrong": len(verdicts.wrong),
            "wrong_tasks": [{"task_id": t.task_id, "why": why, "first_final": t.first_final}
                            for t, why in verdicts.wrong[:EXAMPLES]],
            "duplicated": len(verdicts.duplicated),
            "duplicated_tasks": [{"task_id": t.task_id, "first": _brief(t.first_final),
                                  "again": _brief(t.reread)}
                                 for t in verdicts.duplicated[:EXAMPLES]]}


def when(tasks: Iterable[Tracked], bucket_s: int = 5) -> dict[str, int]:
    """How many of ``tasks`` were submitted in each ``bucket_s`` of the load (``"15-20"``):
    set beside the faults' times, it says which fault they went with."""
    counts = Counter(int(t.scheduled_s // bucket_s) * bucket_s for t in tasks)
    return {f"{start}-{start + bucket_s}": n for start, n in sorted(counts.items())}


def _brief(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {k: record.get(k) for k in ("status", "finished_at", "error") if k in record}


def memory_section(samples: list[Sample], found: list[Trend]) -> dict[str, Any]:
    return {"samples": [asdict(s) for s in samples], "trends": [asdict(t) for t in found]}


def summary(report: dict[str, Any]) -> str:
    """The report as a person reads it."""
    sub, res = report["submissions"], report["results"]
    lines = [
        f"Ferry soak: {report['duration_s']:g} s at {report['rate']:.1f}/s "
        f"(capacity {report['capacity'] or 'not measured'}), seed {report['seed']}",
        f"  sent {sub['sent']}, accepted {sub['accepted']}, refused {sub['refused']} "
        f"{sub['refused_causes'] or ''}, skipped {sub['skipped']}",
        f"  retried POSTs {sub['retries']} over {sub['retried_tasks']} tasks: "
        f"{sub['retry_causes']}",
        f"  finished {res['finished']}; failure reasons {res['failure_reasons'] or '{}'}",
        f"  LOST {res['lost']} {res['lost_reasons'] or ''}   WRONG {res['wrong']}   "
        f"duplicated answers {res['duplicated']}",
        *([f"  lost by submission time (s): {res['lost_by_submission_s']}"] if res["lost"]
          else []),
        f"  faults injected ({sum(report['fault_counts'].values())}): "
        f"{report['fault_counts']}",
        *_fault_lines(report["faults"]),
        f"  restarts: {report['restart_counts']}",
        "  latency per minute (submit -> first final answer):",
        *(f"    minute {m['minute']}: {m['answered']} answered, p50 {m['p50_ms']} ms, "
          f"p99 {m['p99_ms']} ms, max {m['max_ms']} ms" for m in report["latency_per_minute"]),
        f"  memory trends after warm-up (MiB per minute; Redis grows with the records it "
        f"keeps for {report['result_ttl_s']} s):",
        *_trend_lines(report["memory"]["trends"]),
        f"  the soak's own CPU: {report['client_cpu_s']} s; stack started in "
        f"{report['startup_s']} s",
        f"  verdict: {'PASS' if report['ok'] else 'FAIL'} (lost == 0 and wrong == 0)",
    ]
    return "\n".join(lines)


def _fault_lines(events: list[dict[str, Any]]) -> list[str]:
    lines = []
    for event in events:
        at = "not injected" if event["at_s"] is None else f"{event['at_s']:7.2f}s"
        details = ", ".join(f"{k} {v}" for k, v in event["details"].items())
        lines.append(f"    {at} {event['kind']:<14} {event['name'] or '-':<14} {details}")
    return lines


def _trend_lines(found: list[dict[str, Any]]) -> list[str]:
    lines = []
    for trend in found:
        slope = trend["mib_per_min"]
        flag = "  <- grows" if slope is not None and slope > GROWING_MIB_PER_MIN else ""
        shown = "n/a" if slope is None else f"{slope:+.2f}"
        lines.append(f"    {trend['label']:<16} pid {trend['pid']:<8} {trend['first_mib']:8.1f}"
                     f" -> {trend['last_mib']:8.1f} MiB over {trend['samples']:>3} samples: "
                     f"{shown}{flag}")
    return lines
