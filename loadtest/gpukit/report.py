"""The kit's report: a Markdown page from the run's JSON, and the logs worth reading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 400


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Ferry and Triton alone on {_card(result)}", "",
             f"Run {result['started']}, {result.get('elapsed_s', 0):.0f} s. "
             f"{_machine(result)}", ""]
    lines += _engine(result) + _fit(result) + _goodput(result) + _loads(result)
    if result.get("skipped"):
        lines += ["## Skipped", "", *[f"- {s}" for s in result["skipped"]], ""]
    if result.get("errors"):
        lines += ["## Errors", "", *[f"```\n{e}\n```" for e in result["errors"]], ""]
    lines += _runs(result)
    return "\n".join(lines) + "\n"


def _card(result: dict[str, Any]) -> str:
    cards = result["machine"].get("cards") or []
    return cards[0].split(" (UUID")[0] if cards else "this machine's CPU (no GPU)"


def _machine(result: dict[str, Any]) -> str:
    m, sizing = result["machine"], result.get("sizing", {})
    return (f"{m.get('cores')} cores, Python {m.get('python')}, driver "
            f"{m.get('driver') or 'none'}. Ferry: {sizing.get('gateways', '?')} gateway "
            f"processes, {sizing.get('batchers', '?')} batchers, one Redis; result cache and "
            f"request collapsing off. Input: one {result.get('image_bytes', 0):,}-byte JPEG, "
            f"made distinct per request.")


def _engine(result: dict[str, Any]) -> list[str]:
    engines = result.get("engines") or {}
    if not engines:
        return []
    first = next(iter(engines.values()))
    facts = ", ".join(f"{k} {v}" for k, v in first.items() if v not in ("", [], None))
    return ["## The model", "", f"{len(engines)} copies loaded; the first says: {facts}.", ""]


def _fit(result: dict[str, Any]) -> list[str]:
    fit = result.get("fit")
    if not fit:
        return []
    t64 = fit["t_fixed_ms"] + 64 * fit["t_per_ms"]
    capacity = ", ".join(f"{n} inst. {c:,}/s" for n, c in result.get("capacity", {}).items())
    return ["## t(B), from `ferry plan fit`", "",
            f"t(B) = {fit['t_fixed_ms']:.2f} + {fit['t_per_ms']:.3f}·B ms (R² {fit['r2']:.3f}); "
            f"t(64) = {t64:.1f} ms; capacity at full batches: {capacity}. SLO: p99 ≤ "
            f"2·t(64) + 50 ms = {result.get('slo_ms', 0):,.1f} ms; tight: 2·t(64) = "
            f"{result.get('tight_slo_ms', 0):,.1f} ms.", ""]


def _goodput(result: dict[str, Any]) -> list[str]:
    rows = result.get("goodput") or []
    if not rows:
        return []
    lines = ["## Goodput at the SLO (gRPC, perf_analyzer, Poisson)", "",
             "| instances | SLO (p99) | Triton alone | its p99 | Ferry | its p99 | "
             "Ferry / Triton |",
             "|---|---|---|---|---|---|---|"]
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        pairs.setdefault((row["scenario"], row["variant"]), {})[row["system"]] = row
    for (instances, _), pair in pairs.items():
        triton, ferry = pair.get("triton"), pair.get("ferry")
        ratio = (f"{ferry['rate'] / triton['rate']:.2f}"
                 if triton and ferry and triton["rate"] and ferry["rate"] else "")
        slo = (triton or ferry or {}).get("slo_ms", 0)
        lines.append(f"| {instances} | {slo:,.1f} ms | {_rate(triton)} | {_p99(triton)} | "
                     f"{_rate(ferry)} | {_p99(ferry)} | {ratio} |")
    return [*lines, ""]


def _rate(row: dict[str, Any] | None) -> str:
    if row is None:
        return "not run"
    if not row["rate"]:
        return "none good"
    capped = "≥ " if row["rate"] >= row["ceiling"] else ""
    return f"{capped}{row['rate']:,.0f}/s"


def _p99(row: dict[str, Any] | None) -> str:
    at = row.get("at") if row else None
    return f"{at['p99_ms']:,.1f} ms" if at else ""


def _loads(result: dict[str, Any]) -> list[str]:
    rows = result.get("loads") or []
    if not rows:
        return []
    lines = ["## Fixed loads (shares of the fitted capacity)", "",
             "| instances | load | asked/s | Triton alone: served/s, p50 / p99 ms, batch, GPU | "
             "Ferry: served/s, p50 / p99 ms, batch, GPU | Ferry CPU per inference |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['instances']} | {row['share']:.0%} | {row['rate']:,.0f} | "
                     f"{_point(row.get('triton'))} | {_point(row.get('ferry'))} | "
                     f"{_cpu(row.get('ferry'))} |")
    return [*lines, "", "CPU per inference: CPU seconds of Ferry's gateway processes, batchers "
                    "and Redis over the run (and its drain), divided by the inferences Triton "
                    "counted for the model; cores: that CPU over the run's seconds. GPU: the "
                    "driver's utilisation, the share of time a kernel ran. An error CANCELLED "
                    "is perf_analyzer's own: it cancels what is outstanding when the server "
                    "falls behind the asked rate.", ""]


def _point(probe: dict[str, Any] | None) -> str:
    if probe is None:
        return "not run"
    m = probe["measured"]
    if m["errors"]:
        return f"error: {m['errors'][0][:80]}"
    gpu = probe.get("gpu") or {}
    util = f", {gpu['util_pct']:.0f}%" if gpu else ""
    return (f"{m['throughput']:,.0f}, {m['p50_ms']:,.1f} / {m['p99_ms']:,.1f}, "
            f"{probe['mean_batch']:.1f}{util}")


def _cpu(probe: dict[str, Any] | None) -> str:
    if probe is None or not probe["inferences"]:
        return ""
    per = probe["cpu_us_per_inference"]
    cores = probe["cpu_s"].get("ferry", 0.0) / probe["seconds"] if probe["seconds"] else 0.0
    return (f"{per.get('ferry', 0):,.0f} µs (gateway {per.get('gateway', 0):,.0f}, batchers "
            f"{per.get('batchers', 0):,.0f}, Redis {per.get('redis', 0):,.0f}); "
            f"{cores:.1f} cores")


def _runs(result: dict[str, Any]) -> list[str]:
    probes = result.get("probes") or []
    if not probes:
        return []
    lines = ["## Every run", "", "| system | model | asked/s | served/s | p50 ms | p99 ms | "
             "batch | Ferry CPU µs/inf. | GPU util |", "|---|---|---|---|---|---|---|---|---|"]
    for p in probes:
        m, gpu = p["measured"], p.get("gpu") or {}
        served = "error" if m["errors"] else f"{m['throughput']:,.0f}"
        cpu = p["cpu_us_per_inference"].get("ferry", 0) if p["system"] == "ferry" else 0
        lines.append(f"| {p['system']} | {p['model']} | {p['rate']:,.0f} | {served} | "
                     f"{m['p50_ms']:,.1f} | {m['p99_ms']:,.1f} | {p['mean_batch']:.1f} | "
                     f"{f'{cpu:,.0f}' if cpu else ''} | {gpu.get('util_pct', '')} |")
    return lines


def keep_logs(state: Path, out: Path) -> None:
    """The last lines of Triton's log and of each Ferry process's, in one file."""
    parts = []
    for log in sorted([*state.glob("triton/*.log"), *state.glob("logs/*.log")]):
        text = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        parts.append(f"===== {log.relative_to(state)} (last {len(text)} lines)\n" + "\n".join(text))
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs.txt").write_text("\n\n".join(parts) + "\n")
