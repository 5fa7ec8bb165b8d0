"""``ferry usage``: what each client cost, through the gateway's admin API
(``/v1/admin/usage``): a table (the most GPU time first, with each row's share and the totals),
CSV (``--csv``) or the API's JSON (``--json``), over a window back from now (``--since 24h``,
or ``-24h``)."""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import httpx
import orjson

from ferry.durations import WINDOW
from ferry.rollouts.cli import DEFAULT_URL, refusal, token

PATH = "/v1/admin/usage"
COLUMNS = ("client", "model", "tasks", "rows", "gpu_seconds")


def add_parser(commands: Any) -> None:
    usage = commands.add_parser("usage", help="what each client cost: tasks, rows, GPU seconds")
    # A value such as -3h is --since's, not an option: argparse takes only negative numbers
    # for values, and this parser has no option that looks like one.
    usage._negative_number_matcher = re.compile(r"^-\d")
    usage.add_argument("--url", default=os.environ.get("FERRY_URL", DEFAULT_URL),
                       help=f"the gateway (FERRY_URL, default {DEFAULT_URL})")
    usage.add_argument("--token", default=None, help="the admin token (FERRY_ADMIN_TOKEN; "
                       "else the one `ferry up` keeps in .ferry/admin-token, here or in a "
                       "directory above)")
    usage.add_argument("--since", type=since, default="24h", help="how far back: 1h, 24h, "
                       "7d... (-24h is the same; whole hours, UTC; default 24h)")
    usage.add_argument("--model", default="", help="only this model's usage")
    shape = usage.add_mutually_exclusive_group()
    shape.add_argument("--csv", action="store_true", help="print CSV (no totals row)")
    shape.add_argument("--json", action="store_true", help="print the API's JSON")


def since(text: str) -> str:
    """``--since``: a number and a unit, ``3h`` or ``-3h`` (both: three hours back), as the
    route takes it (``3h``); else an error naming why."""
    window = text.strip().removeprefix("-")
    if not WINDOW.fullmatch(window):
        raise argparse.ArgumentTypeError(f"{text!r} is not a window: a number and a unit (s, "
                                         "m, h, d), e.g. 24h or -24h")
    return window


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # read now: a test (capsys) or a caller may have replaced it
    admin = token(args.token)
    headers = {"Authorization": f"Bearer {admin}"} if admin else {}
    params = {"since": args.since, **({"model": args.model} if args.model else {})}
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=30) as http:
            response = http.get(PATH, params=params)
    except httpx.TransportError as exc:
        out.write(f"ferry usage: cannot reach {args.url}: {exc}\n")
        return 1
    doc = response.json() if response.content else {}
    if response.status_code >= 400:
        out.write(f"ferry usage: {refusal(response, doc, args.token)}\n")
        return 1
    if args.json:
        out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.write(as_csv(doc) if args.csv else table(doc))
    return 0


def as_csv(doc: dict[str, Any]) -> str:
    """One line per client and model, with a header."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in doc["usage"]:
        writer.writerow([row["client"], row["model"], row["tasks"], row["rows"],
                         f"{row['gpu_seconds']:.6f}"])
    return text.getvalue()


def table(doc: dict[str, Any]) -> str:
    """What a person reads: the window, a line per client and model with its share of the GPU
    time, and the totals."""
    rows, total = doc["usage"], doc["total"]
    since = datetime.fromtimestamp(doc["from"], UTC).strftime("%Y-%m-%d %H:00Z")
    lines = [f"since {since} ({_window(doc['since_s'])}), "
             f"{'model ' + doc['model'] if doc.get('model') else 'every model'}\n"]
    if not rows:
        return lines[0] + "no tasks finished\n"
    width = max(len("client"), *(len(r["client"]) for r in rows))
    model_width = max(len("model"), *(len(r["model"]) for r in rows))
    lines.append(f"{'client':<{width}}  {'model':<{model_width}}  {'tasks':>9}  {'rows':>9}  "
                 f"{'gpu_seconds':>12}  {'share':>6}\n")
    for row in [*rows, {"client": "total", "model": "", **total}]:
        share = row["gpu_seconds"] / total["gpu_seconds"] if total["gpu_seconds"] else 0.0
        lines.append(f"{row['client']:<{width}}  {row['model']:<{model_width}}  "
                     f"{row['tasks']:>9}  {row['rows']:>9}  {row['gpu_seconds']:>12.3f}  "
                     f"{share:>6.1%}\n")
    return "".join(lines)


def _window(seconds: int) -> str:
    """``7d``, ``24h``, ``90m``: a day is written in hours."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds > size * (unit == "d"):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
