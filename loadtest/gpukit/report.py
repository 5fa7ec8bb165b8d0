"""The kit's report: a Markdown page from the run's JSON, and the logs worth reading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 400
HEADING = "## On a GPU"  # BENCHMARKS.md's section, written by `python -m loadtest.gpukit section`


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Ferry and Triton alone on {_card(result)}", "",
             f"Run {result['started']}, {result.get('elapsed_s', 0):.0f} s. "
             f"{_machine(result)}", ""]
    lines += (_goals(result) + _engine(result) + _fit(result) + _goodput(result)
              + _loads(result) + _batches(result))
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
            f"processes, {sizing.get('batchers', '?')} batchers, {_redis(result)}; result cache "
            f"and request collapsing off{_settings(result)}. Input: one "
            f"{result.get('image_bytes', 0):,}-byte JPEG, "
            f"made distinct per request; the gateway "
            f"{_check(result)}.")


def _masters(result: dict[str, Any]) -> int:
    """Ferry's Redis masters in the run (runs before the option had one)."""
    return int(result.get("sizing", {}).get("redis_masters", 1))


def _redis(result: dict[str, Any]) -> str:
    masters = _masters(result)
    return "one Redis" if masters <= 1 else f"a Redis Cluster of {masters} masters"


def _variant(result: dict[str, Any]) -> str:
    kind = result.get("options", {}).get("input_kind", "image")
    check = "" if kind == "image" else ", no image check at the gateway"
    settings = result.get("options", {}).get("settings") or []
    return check + ("" if _masters(result) <= 1 else f", {_redis(result)}") + "".join(
        f", {setting}" for setting in settings)


def _settings(result: dict[str, Any]) -> str:
    settings = result.get("options", {}).get("settings") or []
    return f"; {', '.join(settings)}" if settings else ""


def _check(result: dict[str, Any]) -> str:
    kind = result.get("options", {}).get("input_kind", "image")
    return "decodes each image before it admits it" if kind == "image" else \
        "checks nothing of the payload (ferry_input_kind bytes)"


GOODPUT_GOAL = 0.9  # Ferry's goodput at the SLO against Triton alone's (issue 37)
P99_GOAL = 1.1  # Ferry's p99 at 80% load against Triton alone's
BATCH_GOAL = 0.9  # the mean batch Ferry sent at 80% load against Triton alone's (issue 44)


def _goals(result: dict[str, Any]) -> list[str]:
    """The kit's three goals, per instance count: met or missed, with the figures."""
    rows, pairs = [], _pairs(result)
    for instances in sorted({str(r["instances"]) for r in result.get("loads", [])}):
        pair = pairs.get((instances, "slo"), {})
        load = next((r for r in result.get("loads", [])
                     if str(r["instances"]) == instances and r["share"] == 0.8), None)
        rows.append(f"| {instances} | {_goodput_goal(pair)} | {_p99_goal(load)} | "
                    f"{_batch_goal(load)} |")
    if not rows:
        return []
    return ["## Goals", "", f"| instances | goodput at the SLO ≥ {GOODPUT_GOAL} times Triton "
            f"alone's | p99 at 80% load ≤ {P99_GOAL} times Triton alone's | mean batch Ferry "
            f"sent at 80% load ≥ {BATCH_GOAL} times Triton alone's |", "|---|---|---|---|",
            *rows, ""]


def _goodput_goal(pair: dict[str, Any]) -> str:
    triton, ferry = pair.get("triton"), pair.get("ferry")
    if not triton or not ferry or not triton["rate"]:
        return "not measured"
    ratio = ferry["rate"] / triton["rate"]
    return f"{ratio:.2f} ({'met' if ratio >= GOODPUT_GOAL else '**missed**'})"


def _p99_goal(load: dict[str, Any] | None) -> str:
    if load is None or "triton" not in load or "ferry" not in load:
        return "not measured"
    triton, ferry = load["triton"]["measured"], load["ferry"]["measured"]
    if ferry["errors"]:
        return f"**missed**: Ferry fell behind at {load['rate']:,.0f}/s ({ferry['errors'][0]})"
    ratio = ferry["p99_ms"] / triton["p99_ms"]
    return (f"{ferry['p99_ms']:,.1f} against {triton['p99_ms']:,.1f} ms: {ratio:.2f} "
            f"({'met' if ratio <= P99_GOAL else '**missed**'})")


def batch_ratio(load: dict[str, Any] | None) -> float | None:
    """The mean batch Ferry sent over the one Triton alone ran, at one load (None: either
    was not run, or ran nothing)."""
    if load is None or "triton" not in load or "ferry" not in load:
        return None
    triton, ferry = load["triton"]["mean_batch"], load["ferry"]["mean_batch"]
    return ferry / triton if triton and ferry else None


def _batch_goal(load: dict[str, Any] | None) -> str:
    ratio = batch_ratio(load)
    if load is None or ratio is None:
        return "not measured"
    return (f"{load['ferry']['mean_batch']:.1f} against {load['triton']['mean_batch']:.1f}: "
            f"{ratio:.2f} ({'met' if ratio >= BATCH_GOAL else '**missed**'})")


def _batches(result: dict[str, Any]) -> list[str]:
    """The mean batch each system's model ran at each fixed load, side by side."""
    rows = [r for r in result.get("loads") or [] if "triton" in r or "ferry" in r]
    if not rows:
        return []
    batchers = result.get("sizing", {}).get("batchers", "?")
    lines = ["## Batch sizes at the fixed loads", "",
             "| instances | load | asked/s | Triton alone ran | Ferry sent | "
             "Ferry / Triton alone |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        ratio = batch_ratio(row)
        lines.append(f"| {row['instances']} | {row['share']:.0%} | {row['rate']:,.0f} | "
                     f"{_batch(row.get('triton'))} | {_batch(row.get('ferry'))} | "
                     f"{'' if ratio is None else f'{ratio:.2f}'} |")
    return [*lines, "", "The mean batch: the inferences Triton counted for the model over the "
                    "run divided by its executions. Triton alone's model batches with Triton's "
                    "dynamic batcher (delay 0); Ferry's has no Triton batching, so its batches "
                    f"are those Ferry's {batchers} batchers sent, sharing the model's instances "
                    "through Redis (a batch at a time on each instance).", ""]


def _batch(probe: dict[str, Any] | None) -> str:
    return "not run" if probe is None else f"{probe['mean_batch']:.1f}"


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
    if not result.get("goodput"):
        return []
    lines = ["## Goodput at the SLO (gRPC, perf_analyzer, Poisson)", "",
             "| instances | SLO (p99) | Triton alone | its p99 | Ferry | its p99 | "
             "Ferry / Triton |",
             "|---|---|---|---|---|---|---|"]
    for (instances, _), pair in _pairs(result).items():
        triton, ferry = pair.get("triton"), pair.get("ferry")
        ratio = (f"{ferry['rate'] / triton['rate']:.2f}"
                 if triton and ferry and triton["rate"] and ferry["rate"] else "")
        slo = (triton or ferry or {}).get("slo_ms", 0)
        lines.append(f"| {instances} | {slo:,.1f} ms | {_rate(triton)} | {_p99(triton)} | "
                     f"{_rate(ferry)} | {_p99(ferry)} | {ratio} |")
    return [*lines, ""]


def _pairs(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The goodput searches by (instance count, SLO variant), then by system."""
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for row in result.get("goodput") or []:
        pairs.setdefault((row["scenario"], row["variant"]), {})[row["system"]] = row
    return pairs


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


def section(results: list[dict[str, Any]], sources: list[str]) -> list[str]:
    """BENCHMARKS.md's GPU section: each kit run's fit, goodput and fixed loads."""
    lines = [HEADING, "", "Measured by the GPU kit (`scripts/gpu-kit.sh run`, docs/gpu-kit.md) on "
             "a lent GPU machine; written here by `python -m loadtest.gpukit section` from the "
             f"runs' JSON ({', '.join(sources)}). Triton alone is the model with Triton's "
             "dynamic batcher (delay 0) at Triton's own gRPC port; Ferry is its gateway in "
             "front of the same model without Triton batching. perf_analyzer (gRPC, Poisson, "
             "one connection per sending thread, distinct JPEGs) drives both, on the same "
             "machine as both. What the figures say, and the kit's limits: docs/gpu-kit.md.",
             ""]
    for result in results:
        sizing = result.get("sizing", {})
        lines += [f"### {_card(result)}, {result['started'][:16].replace('T', ' ')} UTC: "
                  f"{sizing.get('gateways')} gateway processes, {sizing.get('batchers')} "
                  f"batchers{_variant(result)}", "", _machine(result), ""]
        for part in (_goals(result), _engine(result), _fit(result), _goodput(result),
                     _loads(result), _batches(result)):
            lines += [f"##{line}" if line.startswith("## ") else line for line in part]
        lines += [f"Skipped: {'; '.join(result['skipped'])}.", ""] if result.get("skipped") \
            else []
    return lines
