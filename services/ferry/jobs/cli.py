"""``ferry jobs``: submit a directory or a manifest as a job, follow it, collect its results.

``submit`` walks a directory of files (each one an item, its path the ``custom_id``; uploaded
inline, or referenced with ``--reference`` when the server reads that directory itself) or
sends a JSONL manifest, shows a progress line with the rate and the ETA, and writes every result
to ``--out`` once the job ends. It remembers the job beside ``--out`` (``<out>.job``): run the
same command again after Ctrl-C or a lost connection and it follows the same job, never submits
it twice. It speaks to the gateway through ``ferry.client`` (its retries, its
``Idempotency-Key``, its errors), the one way in that Python code has.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import orjson

from ferry.client import Client, ConnectionFailedError, FerryError, JobRecord
from ferry.client.calls import new_idempotency_key

DEFAULT_URL = "http://127.0.0.1:8000"
POLL_S = 1.0


def _explained(error: FerryError) -> str:
    """The gateway's error, with an invalid manifest's lines, one per line."""
    lines = "".join(f"\n  line {p['line']}: {p['code']}: {p['message']}"
                    for p in error.details.get("lines", []) if isinstance(p, Mapping))
    return f"{error}{lines}"


def directory_manifest(root: Path, reference: bool) -> Iterator[bytes]:
    """A manifest of every file under ``root`` (sorted; hidden ones skipped): inline base64, or
    ``file://`` URIs with ``reference``."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(root).parts)):
        custom_id = str(path.relative_to(root))
        if reference:
            item = {"custom_id": custom_id, "uri": path.resolve().as_uri()}
        else:
            item = {"custom_id": custom_id,
                    "input_base64": base64.b64encode(path.read_bytes()).decode()}
        yield orjson.dumps(item) + b"\n"


def manifest_file(source: Path, reference: bool, beside: Path) -> Path:
    """The JSONL file to upload: ``source`` itself, or a directory's manifest written to
    ``beside`` first (so the client streams it from disk and sends it whole again if a retry
    needs it, without holding the directory in memory)."""
    if not source.is_dir():
        return source
    with beside.open("wb") as handle:
        handle.writelines(directory_manifest(source, reference))
    return beside


def progress_line(doc: Mapping[str, Any], *, status: bool = True) -> str:
    """A job's bar, counts, status (unless ``status`` is False: a listing has its own column)
    and pace."""
    counts = doc["request_counts"]
    total, pending = counts["total"], counts["pending"]
    done = total - pending
    progress = doc.get("progress", {})
    filled = int(30 * done / total) if total else 30
    eta = progress.get("eta_s")
    return (f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} "
            f"{doc['status'] + ' ' if status else ''}"
            f"{progress.get('items_per_s', 0):.1f} items/s"
            f"{f' ETA {eta:.0f}s' if isinstance(eta, int | float) and eta else ''} "
            f"(failed {counts['failed']})")


def listing(doc: Mapping[str, Any], as_json: bool = False) -> str:
    """``ferry jobs list``: a line per job, or (``as_json``) the API's JSON."""
    if as_json:
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    return "".join(f"{job['job_id']}  {job['status']:<10} {progress_line(job, status=False)}\n"
                   for job in doc["data"])


def follow(client: Client, job_id: str, stream: TextIO) -> JobRecord:
    """Show the job's progress until it ends; its last record. On a terminal, one line
    rewritten in place; elsewhere (a pipe, a file, a CI log) a line of its own whenever the
    status changes or another tenth of the items is done, and the last."""
    shown = Shown(stream, stream.isatty())
    record = client.wait_job(job_id, on_progress=shown, poll_s=POLL_S)
    shown.end(record)
    return record


class Shown:
    """Where ``follow`` stands: what it last showed."""

    def __init__(self, stream: TextIO, terminal: bool) -> None:
        self.stream, self.terminal = stream, terminal
        self.last: tuple[str, int] | None = None  # status, tenths done

    def __call__(self, record: JobRecord) -> None:
        doc = dict(record.raw or {})
        if self.terminal:
            self.stream.write("\r\x1b[K" + progress_line(doc))
        elif (at := _stage(doc)) != self.last:
            self.stream.write(progress_line(doc) + "\n")
            self.last = at
        self.stream.flush()

    def end(self, record: JobRecord) -> None:
        doc = dict(record.raw or {})
        if self.terminal:
            self.stream.write("\n")
        elif doc.get("request_counts") and _stage(doc) != self.last:
            self.stream.write(progress_line(doc) + "\n")
        self.stream.flush()


def _stage(doc: Mapping[str, Any]) -> tuple[str, int]:
    counts = doc["request_counts"]
    total = counts["total"]
    return str(doc["status"]), (10 * (total - counts["pending"]) // total if total else 10)


def write_results(client: Client, job_id: str, out: Path, file: str = "") -> int:
    """Write the ended job's result lines to ``out`` (atomically, each item once, in line
    order); how many lines."""
    lines = client.final_results(job_id, file or None)
    temp = out.with_name(f".{out.name}.part")
    with temp.open("wb") as handle:
        handle.writelines(orjson.dumps(line.raw) + b"\n" for line in lines)
    os.replace(temp, out)
    return len(lines)


def submit_command(client: Client, args: argparse.Namespace, stream: TextIO) -> int:
    out = Path(args.out)
    state = out.with_name(out.name + ".job")
    remembered = state.read_text().split() if state.exists() else []
    if len(remembered) == 2:
        job_id = remembered[1]
        stream.write(f"following job {job_id} (from {state}; delete it to submit anew)\n")
    else:
        key = remembered[0] if remembered else new_idempotency_key()
        state.write_text(key + "\n")  # before sending: a lost answer is asked again with it
        upload = manifest_file(Path(args.source), args.reference,
                               out.with_name(f".{out.name}.manifest"))
        job_id = client.submit_job(upload, model=args.model or None,
                                   priority=args.priority or None,
                                   completion_window=args.completion_window or None,
                                   idempotency_key=key).job_id
        state.write_text(f"{key} {job_id}\n")
        if upload != Path(args.source):
            upload.unlink()
        stream.write(f"submitted job {job_id}\n")
    record = follow(client, job_id, stream)
    lines = write_results(client, job_id, out)
    state.unlink()
    stream.write(f"job {job_id} {record.status.value}: {lines} result "
                 f"line{'' if lines == 1 else 's'} in {out}\n")
    return 0 if record.status.value == "completed" else 1


def add_parser(commands: Any) -> None:
    jobs = commands.add_parser("jobs", help="bulk jobs: submit, follow, collect")
    jobs.add_argument("--url", default=os.environ.get("FERRY_URL", DEFAULT_URL),
                      help="the gateway (FERRY_URL)")
    jobs.add_argument("--api-key", default=os.environ.get("FERRY_API_KEY", ""),
                      help="an API key, when the gateway asks for one (FERRY_API_KEY)")
    actions = jobs.add_subparsers(dest="action", required=True)
    submit = actions.add_parser("submit", help="submit a directory or a JSONL manifest, "
                                "follow it, write its results (run again to resume)")
    submit.add_argument("source", help="a directory (each file an item) or a JSONL manifest")
    submit.add_argument("--model", default="", help="the model (default: the gateway's)")
    submit.add_argument("--out", required=True, help="where the result lines go")
    submit.add_argument("--priority", default="", help="batch (default), low, normal, high")
    submit.add_argument("--completion-window", default="", help="e.g. 24h (default: the "
                        "gateway's)")
    submit.add_argument("--reference", action="store_true", help="send file:// URIs instead "
                        "of the files (the gateway must allowlist the directory)")
    for name, text in (("status", "a job's state and counts"), ("cancel", "cancel a job"),
                       ("retry", "re-run a finished job's failed items")):
        action = actions.add_parser(name, help=text)
        action.add_argument("job_id")
        # Taken as every client command takes it (after the action); these print JSON anyway.
        action.add_argument("--json", action="store_true", help="print the API's JSON (always)")
    results = actions.add_parser("results", help="write a job's result lines")
    results.add_argument("job_id")
    results.add_argument("--out", required=True)
    results.add_argument("--file", choices=("output", "errors"), default="")
    actions.add_parser("list", help="your jobs, newest first").add_argument(
        "--json", action="store_true", help="print the API's JSON")


def run(args: argparse.Namespace, stream: TextIO = sys.stderr) -> int:
    client = Client(args.url, api_key=args.api_key or None, timeout_s=60.0)
    try:
        return _dispatch(client, args, stream)
    except ConnectionFailedError as exc:
        stream.write(f"\nferry jobs {args.action}: cannot reach {args.url} ({exc}); run the "
                     "same command again to resume\n")
        return 1
    except FerryError as exc:
        stream.write(f"\nferry jobs {args.action}: {_explained(exc)}\n")
        return 1
    except KeyboardInterrupt:
        stream.write("\ninterrupted: the job goes on; run the same command again to follow "
                     "it\n")
        return 130
    finally:
        client.close()


def _dispatch(client: Client, args: argparse.Namespace, stream: TextIO) -> int:
    if args.action == "submit":
        return submit_command(client, args, stream)
    if args.action == "results":
        lines = write_results(client, args.job_id, Path(args.out), args.file)
        stream.write(f"{lines} result lines in {args.out}\n")
        return 0
    if args.action == "list":
        sys.stdout.write(listing(dict(client.jobs().raw), args.json))
        return 0
    act = {"status": client.job, "cancel": client.cancel_job, "retry": client.retry_job}
    record = act[args.action](args.job_id)
    sys.stdout.write(orjson.dumps(record.raw, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
