"""A manifest's upload: streamed to the blob store while every line is checked.

The body is never held whole: each chunk is written as it comes and its complete lines are
checked. Every bad line is reported with its number and reason (the first ``MAX_REPORTED`` of
them, and how many there were); a manifest with any is refused whole, and its file removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ferry.errors import BadRequestError, PayloadTooLargeError
from ferry.jobs.blobs import BlobWriter
from ferry.jobs.manifest import Item, LineError, Problem, Sources, read_item

MAX_REPORTED = 100
Check = Callable[[Item], str]  # a further check of an item against its model: '' or a problem


class ManifestError(BadRequestError):
    """400: the manifest has bad lines (``problems``, the first of them; ``count``, all)."""

    def __init__(self, problems: list[Problem], count: int) -> None:
        shown = f"; the first {len(problems)} are listed" if count > len(problems) else ""
        super().__init__("invalid_manifest", f"{count} line(s) of the manifest are invalid"
                         f"{shown}; nothing was queued")
        self.problems = problems
        self.count = count


@dataclass
class Tally:
    """What the upload has seen so far."""

    lines: int = 0
    size: int = 0
    problems: list[Problem] = field(default_factory=list)
    bad: int = 0
    seen: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)

    def problem(self, problem: Problem) -> None:
        self.bad += 1
        if len(self.problems) < MAX_REPORTED:
            self.problems.append(problem)


@dataclass(frozen=True)
class Limits:
    max_items: int
    max_bytes: int
    max_line_bytes: int


async def upload(chunks: AsyncIterator[bytes], writer: BlobWriter, sources: Sources,
                 limits: Limits, check: Check) -> Tally:
    """Write the manifest and check every line; the tally of a manifest with no bad line
    (``ManifestError`` or a 413 otherwise: the caller aborts the writer)."""
    tally = Tally()
    pending = b""
    async for chunk in chunks:
        tally.size += len(chunk)
        if tally.size > limits.max_bytes:
            raise PayloadTooLargeError("manifest_too_large", f"the manifest exceeds "
                                       f"job_max_bytes ({limits.max_bytes} bytes)")
        await writer.write(chunk)
        *whole, pending = (pending + chunk).split(b"\n")
        for raw in whole:
            _line(raw, tally, sources, limits, check)
        if len(pending) > limits.max_line_bytes:
            raise PayloadTooLargeError("line_too_large", f"line {tally.lines + 1} exceeds "
                                       f"{limits.max_line_bytes} bytes")
    if pending.strip():
        _line(pending, tally, sources, limits, check)
        await writer.write(b"\n")  # the file's every line ends with one
    if tally.bad:
        raise ManifestError(tally.problems, tally.bad)
    if not tally.lines:
        raise BadRequestError("empty_manifest", "the manifest has no items: send one JSON "
                              "object per line")
    return tally


def _line(raw: bytes, tally: Tally, sources: Sources, limits: Limits, check: Check) -> None:
    tally.lines += 1
    number = tally.lines
    if tally.lines > limits.max_items:
        raise PayloadTooLargeError("too_many_items", f"the manifest has more than "
                                   f"job_max_items ({limits.max_items}) lines")
    raw = raw.rstrip(b"\r")
    if len(raw) > limits.max_line_bytes:
        tally.problem(Problem(number, "line_too_large", f"the line exceeds "
                              f"{limits.max_line_bytes} bytes"))
        return
    if not raw.strip():
        tally.problem(Problem(number, "empty_line", "an empty line: every line is an item"))
        return
    try:
        item = read_item(raw, number, sources)
    except LineError as exc:
        tally.problem(exc.problem)
        return
    if item.custom_id in tally.seen:
        tally.problem(Problem(number, "duplicate_custom_id", f"custom_id {item.custom_id!r} "
                              "is used by an earlier line; each names one result"))
        return
    tally.seen.add(item.custom_id)
    tally.kinds.add(item.kind)
    problem = check(item)
    if problem:
        tally.problem(Problem(number, "invalid_input", problem))
