"""``ferry rollout``: a model's rollout through the gateway's admin API (``/v1/admin/rollouts``).

``status`` shows the rollout, each version's figures (since the share last changed, the last
minute, the last ten) and the guard's last look; ``set`` declares a stable version and a
candidate with its share; ``promote`` and ``rollback`` end the candidate's trial; ``compare``
shows the shadow comparison (agreement, the disagreeing tasks' ids, each version's labels);
``decisions`` lists what changed, by whom, why, and the figures it saw.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson

DEFAULT_URL = "http://127.0.0.1:8000"
BASE = "/v1/admin/rollouts"
SET_FIELDS = {"stable": str, "candidate": str, "share": float, "shadow": float, "sticky": str,
              "hold_s": float, "min_requests": int, "max_error_increase": float,
              "max_latency_ratio": float, "latency_slack_ms": float}


def add_parser(commands: Any) -> None:
    rollout = commands.add_parser("rollout", help="model versions: status, set, promote, "
                                  "rollback, compare, decisions")
    # ferry rollout is a one-shot client, not a service: its flags' defaults come from the
    # environment when its command line is parsed, at start-up.
    rollout.add_argument("--url", default=os.environ.get("FERRY_URL", DEFAULT_URL),
                         help="the gateway (FERRY_URL)")
    rollout.add_argument("--token", default=None, help="the admin token (FERRY_ADMIN_TOKEN; "
                         "else the one `ferry up` keeps in .ferry/admin-token)")
    rollout.add_argument("--json", action="store_true", help="print the API's JSON")
    actions = rollout.add_subparsers(dest="action", required=True)
    actions.add_parser("status", help="a model's rollout and figures (none: every "
                       "rollout)").add_argument("model", nargs="?", default="")
    declare = actions.add_parser("set", help="declare a model's stable and candidate versions")
    declare.add_argument("model")
    for name, kind in SET_FIELDS.items():
        declare.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None)
    declare.add_argument("--steps", default=None, help="shares the guard steps through, e.g. "
                         "5,25,50,100")
    declare.add_argument("--manual", action="store_true", help="the guard only reports")
    declare.add_argument("--compare", default=None, help="the shadow comparison, JSON, e.g. "
                         '\'{"kind": "labels", "score": 0.5}\'')
    for name, text in (("promote", "make the candidate the stable version"),
                       ("rollback", "send every request to the stable version again"),
                       ("delete", "forget the model's rollout (Triton's policy picks again)")):
        actions.add_parser(name, help=text).add_argument("model")
    compare = actions.add_parser("compare", help="shadow answers against the primary's")
    compare.add_argument("model")
    compare.add_argument("--candidate", default="", help="a version (default: the rollout's)")
    decisions = actions.add_parser("decisions", help="what changed, by whom and why")
    decisions.add_argument("model")
    decisions.add_argument("--limit", type=int, default=20)


def token(given: str | None) -> str:
    """The admin token: given, else FERRY_ADMIN_TOKEN, else the local stack's (``ferry up``
    keeps it in ``$FERRY_STATE_DIR/admin-token``, ``.ferry`` by default)."""
    if given is not None:
        return given
    # Read once, as the command starts (a one-shot client: no settings object of its own).
    if os.environ.get("FERRY_ADMIN_TOKEN"):
        return os.environ["FERRY_ADMIN_TOKEN"]
    kept = Path(os.environ.get("FERRY_STATE_DIR", ".ferry")) / "admin-token"
    return kept.read_text().strip() if kept.is_file() else ""


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    admin = token(args.token)
    headers = {"Authorization": f"Bearer {admin}"} if admin else {}
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=30) as http:
            response = _request(http, args)
    except httpx.TransportError as exc:
        out.write(f"ferry rollout {args.action}: cannot reach {args.url}: {exc}\n")
        return 1
    doc = response.json() if response.content else {}
    if response.status_code >= 400:
        error = doc.get("error", {}) if isinstance(doc, dict) else {}
        out.write(f"ferry rollout {args.action}: HTTP {response.status_code} "
                  f"{error.get('code', '')}: {error.get('message', response.text)}\n")
        return 1
    out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n" if args.json
              else render(args.action, doc))
    return 0


def _request(http: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    model = getattr(args, "model", "")
    if args.action == "status":
        return http.get(f"{BASE}/{model}" if model else BASE)
    if args.action == "set":
        return http.put(f"{BASE}/{model}", content=orjson.dumps(declaration(args)))
    if args.action in ("promote", "rollback"):
        return http.post(f"{BASE}/{model}/{args.action}")
    if args.action == "delete":
        return http.delete(f"{BASE}/{model}")
    if args.action == "compare":
        return http.get(f"{BASE}/{model}/compare",
                        params={"candidate": args.candidate} if args.candidate else {})
    return http.get(f"{BASE}/{model}/decisions", params={"limit": args.limit})


def declaration(args: argparse.Namespace) -> dict[str, Any]:
    """The rollout ``set`` declares: the options given."""
    doc: dict[str, Any] = {name: getattr(args, name) for name in SET_FIELDS
                           if getattr(args, name) is not None}
    if args.steps:
        doc["steps"] = [float(step) for step in args.steps.split(",") if step.strip()]
    if args.manual:
        doc["auto"] = False
    if args.compare:
        doc["compare"] = orjson.loads(args.compare)
    return doc


def render(action: str, doc: dict[str, Any]) -> str:
    """What a person reads."""
    if action == "status" and "rollouts" in doc:
        return "".join(_rollout_line(r) for r in doc["rollouts"]) or "no rollouts\n"
    if action == "status":
        return _status(doc)
    if action == "compare":
        return _comparison(doc)
    if action == "decisions":
        return "".join(_decision_line(d) for d in doc["decisions"]) or "no decisions\n"
    if action == "delete":
        return f"{doc['model']}: rollout deleted\n"
    return _rollout_line(doc)


def when(at: float, now: float | None = None) -> str:
    """A Unix time as a person reads it: UTC to the second, and how long ago."""
    if not at:
        return "never"
    now = time.time() if now is None else now
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"{stamp} ({_ago(now - at)})"


def _ago(seconds: float) -> str:
    if seconds < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _rollout_line(r: dict[str, Any]) -> str:
    shadow = f", shadow {r['shadow']:g}%" if r["shadow"] else ""
    candidate = f", candidate {r['candidate']} at {r['share']:g}%{shadow}" if r["candidate"] \
        else ""
    return (f"{r['model']}: {r['state']}, stable {r['stable'] or '(policy)'}{candidate}"
            f"{'' if r['auto'] else ' (manual)'}, generation {r['generation']}\n")


def _status(doc: dict[str, Any]) -> str:
    r = doc["rollout"]
    lines = [_rollout_line(r), f"share set {when(r.get('since', 0))}, changed "
                               f"{when(r.get('updated_at', 0))}\n"]
    lines.append(f"{'version':<8} {'window':<12} {'requests':>8} {'errors':>7} "
                 f"{'queue p50/p99 ms':>17} {'triton p50/p99 ms':>18}\n")
    for version, windows in doc["figures"].items():
        for window, f in windows.items():
            lines.append(f"{version:<8} {window:<12} {f['requests']:>8} {f['error_rate']:>7.2%} "
                         f"{f['queue_p50_ms']:>8.1f}/{f['queue_p99_ms']:<8.1f} "
                         f"{f['triton_p50_ms']:>8.1f}/{f['triton_p99_ms']:<8.1f}\n")
    guard = doc.get("guard")
    if guard:
        lines.append(f"guard, {when(guard.get('at', 0))}: {guard['action']}: "
                     f"{guard['reason']}\n")
    lines += [_decision_line(d) for d in doc.get("decisions", [])[:5]]
    return "".join(lines)


def _decision_line(d: dict[str, Any]) -> str:
    return (f"  {when(d.get('at', 0))} {d.get('by', '?')}: {d.get('action')}: "
            f"{d.get('reason', '')}\n")


def _comparison(doc: dict[str, Any]) -> str:
    agreement = doc.get("agreement")
    lines = [f"{doc['model']}: candidate {doc['candidate']} against stable {doc['stable']}: "
             f"{doc['compared']} compared, {doc['agreed']} agree"
             f"{f' ({agreement:.2%})' if agreement is not None else ''}, {doc['waiting']} "
             f"waiting, skipped {doc['skipped'] or 'none'}\n"]
    if "max_abs_diff" in doc:
        lines.append(f"tensors: max abs diff {doc['max_abs_diff']:g}, max rel diff "
                     f"{doc['max_rel_diff']:g}\n")
    for side in ("primary", "shadow"):
        labels = doc[f"labels_{side}"]
        if labels["share"] or labels["unsafe"]:
            lines.append(f"{side} labels over {labels['answers']} answers: unsafe "
                         f"{labels['unsafe']}, {labels['share']}\n")
    for example in doc.get("examples", [])[:10]:
        lines.append(f"  differs: {example['primary_task_id']} vs {example['shadow_task_id']}: "
                     f"{example['detail']}\n")
    return "".join(lines)
