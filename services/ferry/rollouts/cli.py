"""``ferry rollout``: a model's rollout through the gateway's admin API (``/v1/admin/rollouts``).

``status`` shows the rollout, each version's figures (since the share last changed, the last
minute, the last ten) and the guard's last look; ``set`` changes the options given (a stable
version, a candidate with its share, shadows, steps, rules) and keeps the others; ``promote``
and ``rollback`` end the candidate's trial; ``compare`` shows the shadow comparison (agreement,
the disagreeing tasks' ids, each version's labels); ``decisions`` lists what changed, by whom,
why, and the figures it saw. ``--url``, ``--token`` and ``--json`` go after ``rollout`` or
after the action.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

import httpx
import orjson

from ferry.rollouts.rollout import DEFAULT_STEPS, step_problems
from ferry.stack.state import ADMIN_TOKEN_FILE, kept

DEFAULT_URL = "http://127.0.0.1:8000"
BASE = "/v1/admin/rollouts"
SET_FIELDS = {"stable": str, "candidate": str, "share": float, "shadow": float, "sticky": str,
              "hold_s": float, "min_requests": int, "max_error_increase": float,
              "max_latency_ratio": float, "latency_slack_ms": float}


def add_parser(commands: Any) -> None:
    rollout = commands.add_parser("rollout", help="model versions: status, set, promote, "
                                  "rollback, compare, decisions")
    client_options(rollout)
    actions = rollout.add_subparsers(dest="action", required=True)
    _action(actions, "status", "a model's rollout and figures (none: every rollout)"
            ).add_argument("model", nargs="?", default="")
    _add_set(_action(actions, "set", "change a model's rollout: the options given, the others "
                     "kept (none yet: their defaults)"))
    for name, text in (("promote", "make the candidate the stable version"),
                       ("rollback", "send every request to the stable version again"),
                       ("delete", "forget the model's rollout (Triton's policy picks again)")):
        _action(actions, name, text).add_argument("model")
    compare = _action(actions, "compare", "shadow answers against the primary's")
    compare.add_argument("model")
    compare.add_argument("--candidate", default="", help="a version (default: the rollout's)")
    decisions = _action(actions, "decisions", "what changed, by whom and why")
    decisions.add_argument("model")
    decisions.add_argument("--limit", type=int, default=20)


def client_options(parser: argparse.ArgumentParser, again: bool = False) -> None:
    """``--url``, ``--token`` and ``--json``, which a client command takes right after its name
    and, ``again``, after its action too (``ferry rollout status m --json``)."""
    # ferry rollout is a one-shot client, not a service: its flags' defaults come from the
    # environment when its command line is parsed, at start-up. After the action a flag sets
    # its value only when given, so that it does not hide the one given before the action.
    def default(value: object) -> object:
        return argparse.SUPPRESS if again else value

    parser.add_argument("--url", default=default(os.environ.get("FERRY_URL", DEFAULT_URL)),
                        help=f"the gateway (FERRY_URL, default {DEFAULT_URL})")
    parser.add_argument("--token", default=default(None), help="the admin token "
                        "(FERRY_ADMIN_TOKEN; else the one `ferry up` keeps in "
                        ".ferry/admin-token, here or in a directory above)")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print the API's JSON")


def _action(actions: Any, name: str, text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = actions.add_parser(name, help=text, description=text)
    client_options(parser, again=True)
    return parser


def _add_set(declare: argparse.ArgumentParser) -> None:
    declare.add_argument("model")
    for name, kind in SET_FIELDS.items():
        declare.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None)
    declare.add_argument("--steps", type=steps, default=None, help="the shares the guard "
                         "steps through, rising, the last 100 (reaching it promotes the "
                         "candidate), e.g. 5,25,50,100")
    guard = declare.add_mutually_exclusive_group()
    guard.add_argument("--manual", action="store_true", help="the guard only reports")
    guard.add_argument("--auto", action="store_true", help="the guard steps the share up, "
                       "promotes and rolls back (the default)")
    declare.add_argument("--compare", type=json_object, default=None, help="the shadow "
                         'comparison, JSON, e.g. \'{"kind": "labels", "score": 0.5}\'')


def steps(text: str) -> list[float]:
    """``--steps 5,25,50,100``: percentages, rising, the last 100; else an error naming why
    (argparse's own message, no traceback)."""
    shares = []
    for entry in text.split(","):
        if not entry.strip():
            raise argparse.ArgumentTypeError(f"an empty entry in {text!r}: percentages "
                                             "separated by commas, e.g. 5,25,50,100")
        try:
            shares.append(float(entry))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{entry.strip()!r} is not a number: percentages "
                                             "separated by commas, e.g. 5,25,50,100") from None
    problems = step_problems(shares)
    if problems:
        raise argparse.ArgumentTypeError("; ".join(problems))
    return shares


def json_object(text: str) -> dict[str, Any]:
    """``--compare '{...}'``: a JSON object, else an error naming why."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError("a JSON object, e.g. '{\"kind\": \"labels\"}'")
    return doc


def token(given: str | None) -> str:
    """The admin token: given, else FERRY_ADMIN_TOKEN, else the local stack's (``ferry up``
    keeps it in ``$FERRY_STATE_DIR/admin-token``: ``ferry.stack.state``)."""
    if given is not None:
        return given
    # Read once, as the command starts (a one-shot client: no settings object of its own).
    if os.environ.get("FERRY_ADMIN_TOKEN"):
        return os.environ["FERRY_ADMIN_TOKEN"]
    return kept(ADMIN_TOKEN_FILE)[0]


def token_hint(given: str | None) -> str:
    """What a refused admin call adds (a 401): where the token it sent came from, or where one
    was looked for."""
    if given is not None:
        return "the token given with --token was refused"
    if os.environ.get("FERRY_ADMIN_TOKEN"):
        return "the token in FERRY_ADMIN_TOKEN was refused"
    found, path = kept(ADMIN_TOKEN_FILE)
    if found:
        return f"the token in {path} was refused: the one ferry up kept there, for its gateway"
    return (f"no admin token was given (--token, FERRY_ADMIN_TOKEN) nor found in {path}, "
            "where ferry up keeps its own")


def refusal(response: httpx.Response, doc: Any, given: str | None) -> str:
    """An admin call's error answer as one line: its status, code and message, and for a 401
    where the token came from (``token_hint``)."""
    error = doc.get("error", {}) if isinstance(doc, dict) else {}
    hint = f" ({token_hint(given)})" if response.status_code == 401 else ""
    return (f"HTTP {response.status_code} {error.get('code', '')}: "
            f"{error.get('message', response.text)}{hint}")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # read now: a test (capsys) or a caller may have replaced it
    if args.action == "set" and not declaration(args):
        out.write("ferry rollout set: nothing to change: give --stable, --candidate, --share, "
                  "--shadow, --steps or another option (see --help)\n")
        return 2
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
        out.write(f"ferry rollout {args.action}: {refusal(response, doc, args.token)}\n")
        return 1
    out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n" if args.json
              else render(args.action, doc))
    return 0


def _request(http: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    model = getattr(args, "model", "")
    if args.action == "status":
        return http.get(f"{BASE}/{model}" if model else BASE)
    if args.action == "set":  # a PATCH: what is not given keeps its value
        return http.patch(f"{BASE}/{model}", content=orjson.dumps(declaration(args)))
    if args.action in ("promote", "rollback"):
        return http.post(f"{BASE}/{model}/{args.action}")
    if args.action == "delete":
        return http.delete(f"{BASE}/{model}")
    if args.action == "compare":
        return http.get(f"{BASE}/{model}/compare",
                        params={"candidate": args.candidate} if args.candidate else {})
    return http.get(f"{BASE}/{model}/decisions", params={"limit": args.limit})


def declaration(args: argparse.Namespace) -> dict[str, Any]:
    """What ``set`` changes: the options given, no others."""
    doc: dict[str, Any] = {name: getattr(args, name) for name in (*SET_FIELDS, "steps",
                                                                   "compare")
                           if getattr(args, name) is not None}
    if args.manual or args.auto:
        doc["auto"] = bool(args.auto)
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
    trial = f", shadow {r['shadow']:g}%" if r["shadow"] else ""
    if r.get("steps", list(DEFAULT_STEPS)) != list(DEFAULT_STEPS):  # the defaults go unsaid
        trial += f", steps {'/'.join(f'{s:g}' for s in r['steps'])}%"
    candidate = f", candidate {r['candidate']} at {r['share']:g}%{trial}" if r["candidate"] \
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
