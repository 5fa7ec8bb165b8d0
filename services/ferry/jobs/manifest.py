"""A bulk job's manifest: one JSON object per line, each an item with its ``custom_id``.

Pure code, no I/O. An item names its input one way of four: ``input`` (UTF-8 text),
``input_base64`` (bytes), ``inputs`` (tensors, as an infer request of the Open Inference
Protocol has them) or ``uri`` (an object under a root the operator allowlisted). Every problem is
reported with its line number (1-based), so that a user fixes them all in one go.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import urllib.parse
from dataclasses import dataclass
from typing import Any

import orjson

ITEM_FIELDS = frozenset({"custom_id", "input", "input_base64", "inputs", "uri", "parameters"})
INPUT_FIELDS = ("input", "input_base64", "inputs", "uri")
MAX_CUSTOM_ID = 256
URI_SCHEMES = ("file", "s3")


@dataclass(frozen=True)
class Problem:
    """What is wrong with one line of a manifest."""

    line: int
    code: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "code": self.code, "message": self.message}


class LineError(ValueError):
    """A line that is not an item (its ``problem`` says why)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


@dataclass(frozen=True)
class Item:
    """One checked line: its ``custom_id`` and how it names its input (``kind`` is one of
    ``INPUT_FIELDS``; ``doc`` is the line's object, kept for the tensor form)."""

    line: int
    custom_id: str
    kind: str
    doc: dict[str, Any]

    @property
    def uri(self) -> str:
        return str(self.doc["uri"])


def read_item(raw: bytes, line: int, sources: Sources) -> Item:
    """The item on ``raw`` (one line, newline stripped), or ``LineError`` saying what is wrong."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(line, "malformed_json", f"not a JSON object: {exc}") from None
    if not isinstance(doc, dict):
        raise _bad(line, "malformed_json", "each line must be a JSON object")
    unknown = sorted(set(doc) - ITEM_FIELDS)
    if unknown:
        raise _bad(line, "unknown_field", f"unknown field(s) {unknown}; an item takes "
                   f"{sorted(ITEM_FIELDS)}")
    custom_id = _custom_id(doc.get("custom_id"), line)
    named = [field for field in INPUT_FIELDS if field in doc]
    if len(named) != 1:
        raise _bad(line, "missing_input" if not named else "ambiguous_input",
                   f"an item names its input with exactly one of {list(INPUT_FIELDS)}; "
                   f"this one has {named or 'none'}")
    kind = named[0]
    if "parameters" in doc and kind != "inputs":
        raise _bad(line, "invalid_field", "'parameters' goes with 'inputs' (the tensor form)")
    _check_input(kind, doc[kind], line, sources)
    return Item(line, custom_id, kind, doc)


def _custom_id(value: Any, line: int) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(line, "missing_custom_id", "each item needs a 'custom_id' string: it names "
                   "the item's result")
    if len(value) > MAX_CUSTOM_ID or not value.isprintable():
        raise _bad(line, "invalid_custom_id", f"'custom_id' must be 1 to {MAX_CUSTOM_ID} "
                   "printable characters")
    return value


def _check_input(kind: str, value: Any, line: int, sources: Sources) -> None:
    if kind == "inputs":
        if not isinstance(value, list) or not value:
            raise _bad(line, "invalid_tensors", "'inputs' must be a non-empty list of tensors")
        return  # checked against the model's tensors by the caller
    if not isinstance(value, str) or not value:
        raise _bad(line, "empty_input", f"'{kind}' must be a non-empty string")
    if kind == "input_base64":
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(line, "invalid_base64", "'input_base64' is not valid base64") from None
        if not decoded:
            raise _bad(line, "empty_input", "'input_base64' decodes to nothing")
    elif kind == "uri":
        problem = sources.refusal(value)
        if problem:
            raise _bad(line, "disallowed_uri", problem)


def _bad(line: int, code: str, message: str) -> LineError:
    return LineError(Problem(line, code, message))


@dataclass(frozen=True)
class Sources:
    """The roots a job's ``uri`` items may name (``file:///mnt/images/``,
    ``s3://bucket/prefix/``), from the operator's comma-separated ``job_sources``."""

    roots: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Sources:
        roots = []
        for raw in (part.strip() for part in text.split(",")):
            if not raw:
                continue
            parsed = urllib.parse.urlsplit(raw)
            local = parsed.scheme == "file" and parsed.path.startswith("/") and not parsed.netloc
            if not (local or (parsed.scheme == "s3" and parsed.netloc)):
                raise ValueError(f"a job source is file:///<absolute dir>/ or "
                                 f"s3://<bucket>/<prefix>/, not {raw!r}")
            roots.append(raw if raw.endswith("/") else raw + "/")
        return cls(tuple(roots))

    def refusal(self, uri: str) -> str:
        """Why ``uri`` may not be read ('' if it may): it must lie under an allowlisted root,
        with no ``..``, query or fragment."""
        parsed = urllib.parse.urlsplit(uri)
        if parsed.scheme not in URI_SCHEMES:
            return f"'uri' must be a file:// or s3:// URI, not {uri[:80]!r}"
        if parsed.query or parsed.fragment or "\\" in uri:
            return f"'uri' may not have a query, a fragment or backslashes: {uri[:80]!r}"
        if posixpath.normpath(parsed.path or "/") != (parsed.path or "/") or ".." in \
                parsed.path.split("/"):
            return f"'uri' must be a plain path (no '..', '.', '//'): {uri[:80]!r}"
        if not self.roots:
            return "this Ferry reads no URIs: its operator has allowlisted no job sources"
        if not any(uri.startswith(root) and len(uri) > len(root) for root in self.roots):
            return f"{uri[:80]!r} is not under an allowlisted root ({', '.join(self.roots)})"
        return ""

