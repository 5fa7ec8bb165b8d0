"""A job's result lines: made from task records, written in segments, merged at the end.

Each committed segment holds result lines sorted by line number. The output file (succeeded
items) and the error file (every other) are a merge of all segments in line order; where an item
has lines in several segments (a retry ran it again), the last committed one wins, so each
``custom_id`` appears exactly once.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from ferry.jobs.blobs import BlobStore
from ferry.jobs.model import TASK_TO_ITEM, ItemStatus
from ferry.tasks.record import StoredRecord

TASK_ERROR_CODES = {ItemStatus.FAILED: "inference_failed", ItemStatus.CANCELLED: "cancelled",
                    ItemStatus.EXPIRED: "expired"}


@dataclass(frozen=True)
class Result:
    """One item's end, as its result line says it."""

    index: int  # 0-based: the manifest's line number less one
    status: ItemStatus
    line: bytes  # the JSON line, without its newline


def result_line(index: int, custom_id: str, status: ItemStatus, **fields: Any) -> Result:
    doc = {"custom_id": custom_id, "line": index + 1, "status": status.value, **fields}
    return Result(index, status, orjson.dumps(doc))


def failure(index: int, custom_id: str, status: ItemStatus, code: str, message: str) -> Result:
    return result_line(index, custom_id, status, error={"code": code, "message": message})


def from_record(index: int, custom_id: str, task_id: str, record: StoredRecord,
                cancelled_as: ItemStatus = ItemStatus.CANCELLED) -> Result:
    """An item's result from its task's final record (a cancelled task is ``cancelled_as``:
    ``expired`` when the job's window closed on it)."""
    doc = record.to_json()
    status = TASK_TO_ITEM[record.status.value]
    if status is ItemStatus.CANCELLED:
        status = cancelled_as
    fields: dict[str, Any] = {"task_id": task_id}
    if doc.get("model_version"):
        fields["model_version"] = doc["model_version"]
    if doc.get("cache"):
        fields["cache"] = doc["cache"]
    if status is ItemStatus.SUCCEEDED:
        fields["output"] = doc.get("output")
    else:
        fields["error"] = {"code": TASK_ERROR_CODES[status],
                           "message": doc.get("error") or f"the item's task ended {status}"}
    return result_line(index, custom_id, status, **fields)


def segment_bytes(results: Iterable[Result]) -> bytes:
    """A segment file: the results sorted by line, one JSON line each."""
    return b"".join(r.line + b"\n" for r in sorted(results, key=lambda r: r.index))


async def segment_lines(blobs: BlobStore, name: str) -> AsyncIterator[bytes]:
    """A stored file's lines (newline stripped), read in chunks."""
    pending = b""
    async for chunk in blobs.stream(name):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            if line:
                yield line
    if pending:
        yield pending


async def keyed(blobs: BlobStore, name: str, order: int) -> list[tuple[int, int, bytes]]:
    """A file's result lines, each as (its line number, ``order``, the line): for merges."""
    found = []
    async for line in segment_lines(blobs, name):
        found.append((line_number(line), order, line))
    return found


def line_number(line: bytes) -> int:
    """The manifest line a result line is for (0 if it names none)."""
    number = orjson.loads(line).get("line")
    return int(number) if isinstance(number, int) else 0


def latest(merged: Iterator[tuple[int, int, bytes]]) -> Iterator[bytes]:
    """Of lines sorted by (line number, segment order), the last of each line number."""
    held: tuple[int, int, bytes] | None = None
    for entry in merged:
        if held is not None and held[0] != entry[0]:
            yield held[2]
        held = entry
    if held is not None:
        yield held[2]


async def merged(blobs: BlobStore, segments: list[str]) -> Iterator[bytes]:
    """Every item's last result line, in line order.

    Each segment is read whole, one at a time (a segment is at most a window of items), and
    kept as its sorted keys and lines until the merge: memory grows with the job's results, a
    bound the operator sets with ``job_max_items``.
    """
    parts = [await keyed(blobs, name, order) for order, name in enumerate(segments)]
    return latest(heapq.merge(*parts))


def status_of(line: bytes) -> ItemStatus:
    return ItemStatus(orjson.loads(line)["status"])
