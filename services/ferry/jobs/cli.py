"""``ferry jobs``: submit a directory or a manifest as a job, follow it, collect its results.

``submit`` walks a directory of files (each one an item, its path the ``custom_id``; uploaded
inline, or referenced with ``--reference`` when the server reads that directory itself) or
sends a JSONL manifest, shows a progress line with the rate and the ETA, and writes every result
to ``--out`` once the job ends. It remembers the job beside ``--out`` (``<out>.job``): run the
same command again after Ctrl-C or a lost connection and it follows the same job, never submits
it twice.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson

DEFAULT_URL = "http://127.0.0.1:8000"
FINAL = frozenset({"completed", "failed", "cancelled", "expired"})
RETRY_S = (0.5, 1, 2, 4, 8)  # waits between attempts when the gateway cannot be reached
POLL_S = 1.0
UPLOAD_CHUNK = 1 << 20


class JobClient:
    """The ``/v1/jobs`` routes over HTTP, retrying what a lost connection interrupted."""

    def __init__(self, url: str, api_key: str = "", timeout_s: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; retried on a lost connection or a 502/503 (a submit, whose body is a
        one-pass stream, is not: the command is run again, with the same Idempotency-Key)."""
        once = method == "POST" and path == "/v1/jobs"
        for wait_s in (None,) if once else (*RETRY_S, None):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError:
                if wait_s is None:
                    raise
                time.sleep(wait_s)
                continue
            if response.status_code in (502, 503) and wait_s is not None:
                time.sleep(wait_s)
                continue
            return response
        raise AssertionError("unreachable")

    def submit(self, body: Iterator[bytes], params: dict[str, str], key: str
               ) -> dict[str, Any]:
        """Submit once: ``key`` (an Idempotency-Key) makes a repeat get the job the first
        created, if it got that far."""
        response = self.call("POST", "/v1/jobs", content=body, params=params,
                             headers={"Content-Type": "application/x-ndjson",
                                      "Idempotency-Key": key})
        return _json(response, 202)

    def status(self, job_id: str) -> dict[str, Any]:
        return _json(self.call("GET", f"/v1/jobs/{job_id}"), 200)

    def results(self, job_id: str, out: Path, file: str = "") -> int:
        """Write the job's results to ``out`` (atomically); how many lines."""
        params = {"file": file} if file else {}
        temp = out.with_name(f".{out.name}.part")
        lines = 0
        with self.http.stream("GET", f"/v1/jobs/{job_id}/results", params=params) as response:
            if response.status_code != 200:
                response.read()
                _json(response, 200)
            with temp.open("wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
                    lines += chunk.count(b"\n")
        os.replace(temp, out)
        return lines


class JobError(Exception):
    """An answer that is not the one expected: its status and the server's error."""


def _json(response: httpx.Response, expected: int) -> dict[str, Any]:
    if response.status_code != expected:
        raise JobError(f"{response.request.method} {response.request.url.path}: "
                       f"{response.status_code} {_explained(response)}")
    doc: dict[str, Any] = response.json()
    return doc


def _explained(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
    lines = "".join(f"\n  line {p['line']}: {p['code']}: {p['message']}"
                    for p in error.get("lines", []))
    return f"{error.get('code')}: {error.get('message')}{lines}"


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


def file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(UPLOAD_CHUNK):
            yield chunk


def progress_line(doc: dict[str, Any]) -> str:
    counts = doc["request_counts"]
    total, pending = counts["total"], counts["pending"]
    done = total - pending
    progress = doc.get("progress", {})
    filled = int(30 * done / total) if total else 30
    eta = progress.get("eta_s")
    return (f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {doc['status']} "
            f"{progress.get('items_per_s', 0):.1f} items/s"
            f"{f' ETA {eta:.0f}s' if isinstance(eta, int | float) and eta else ''} "
            f"(failed {counts['failed']})")


def listing(doc: dict[str, Any], as_json: bool = False) -> str:
    """``ferry jobs list``: a line per job, or (``as_json``) the API's JSON."""
    if as_json:
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    return "".join(f"{job['job_id']}  {job['status']:<10} {progress_line(job)}\n"
                   for job in doc["data"])


def follow(client: JobClient, job_id: str, stream: TextIO) -> dict[str, Any]:
    """Show the job's progress until it ends; its last record."""
    while True:
        doc = client.status(job_id)
        stream.write("\r" + progress_line(doc))
        stream.flush()
        if doc["status"] in FINAL:
            stream.write("\n")
            return doc
        time.sleep(POLL_S)


def submit_command(client: JobClient, args: argparse.Namespace, stream: TextIO) -> int:
    out = Path(args.out)
    state = out.with_name(out.name + ".job")
    remembered = state.read_text().split() if state.exists() else []
    if len(remembered) == 2:
        job_id = remembered[1]
        stream.write(f"following job {job_id} (from {state}; delete it to submit anew)\n")
    else:
        key = remembered[0] if remembered else secrets.token_hex(16)
        state.write_text(key + "\n")  # before sending: a lost answer is asked again with it
        source = Path(args.source)
        body = (directory_manifest(source, args.reference) if source.is_dir()
                else file_chunks(source))
        params = {k: v for k, v in (("model", args.model), ("priority", args.priority),
                                    ("completion_window", args.completion_window)) if v}
        job_id = client.submit(body, params, key)["job_id"]
        state.write_text(f"{key} {job_id}\n")
        stream.write(f"submitted job {job_id}\n")
    doc = follow(client, job_id, stream)
    lines = client.results(job_id, out)
    state.unlink()
    stream.write(f"job {job_id} {doc['status']}: {lines} result lines in {out}\n")
    return 0 if doc["status"] == "completed" else 1


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
    client = JobClient(args.url, args.api_key)
    try:
        return _dispatch(client, args, stream)
    except JobError as exc:
        stream.write(f"\nferry jobs {args.action}: {exc}\n")
        return 1
    except httpx.TransportError as exc:
        stream.write(f"\nferry jobs {args.action}: cannot reach {args.url} ({exc}); run the "
                     "same command again to resume\n")
        return 1
    except KeyboardInterrupt:
        stream.write("\ninterrupted: the job goes on; run the same command again to follow "
                     "it\n")
        return 130
    finally:
        client.close()


def _dispatch(client: JobClient, args: argparse.Namespace, stream: TextIO) -> int:
    if args.action == "submit":
        return submit_command(client, args, stream)
    if args.action == "results":
        lines = client.results(args.job_id, Path(args.out), args.file)
        stream.write(f"{lines} result lines in {args.out}\n")
        return 0
    if args.action == "list":
        sys.stdout.write(listing(_json(client.call("GET", "/v1/jobs"), 200), args.json))
        return 0
    method, path, expected = {
        "status": ("GET", "", 200), "cancel": ("DELETE", "", 202),
        "retry": ("POST", "/retry", 202)}[args.action]
    doc = _json(client.call(method, f"/v1/jobs/{args.job_id}{path}"), expected)
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
