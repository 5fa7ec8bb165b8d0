"""A job's item as the submission a client would have made for it, at the job's priority."""

from __future__ import annotations

import asyncio
import base64
import mimetypes
import urllib.parse
from pathlib import Path

from ferry.errors import BadRequestError, PayloadTooLargeError
from ferry.gateway.intake import Submission, TensorForm, TensorSubmission
from ferry.jobs.manifest import Item, Sources
from ferry.oip.request import InferRequest, read_infer_request
from ferry.priority import Priority
from ferry.tensors import TensorError


class ItemMaker:
    """Makes submissions of items: reads ``uri`` items from the allowlisted sources."""

    def __init__(self, sources: Sources, max_item_bytes: int) -> None:
        self.sources = sources
        self.max_item_bytes = max_item_bytes

    async def submission(self, item: Item, job: dict[str, str]) -> Submission:
        """The item as a task's submission (a 4xx for an input it cannot be)."""
        model, client_id = job["model"], job.get("client", "")
        priority = Priority.of(int(job.get("priority", Priority.BATCH)))
        timeout_s = float(job.get("timeout") or 0) or None
        if item.kind == "inputs":
            return TensorSubmission(model=model, payload=b"", content_type="",
                                    client_id=client_id, priority=priority, timeout_s=timeout_s,
                                    tensors=TensorForm(item_request(item), job.get("version", "")))
        payload, content_type = await self._payload(item)
        return Submission(model=model, payload=payload, content_type=content_type,
                          client_id=client_id, priority=priority, timeout_s=timeout_s)

    async def _payload(self, item: Item) -> tuple[bytes, str]:
        if item.kind == "input":
            return str(item.doc["input"]).encode("utf-8"), "text/plain"
        if item.kind == "input_base64":
            return base64.b64decode(item.doc["input_base64"]), "application/octet-stream"
        refusal = self.sources.refusal(item.uri)
        if refusal:
            raise BadRequestError("disallowed_uri", refusal)
        path = Path(urllib.parse.unquote(urllib.parse.urlsplit(item.uri).path))
        data = await asyncio.to_thread(_read_file, path, self.max_item_bytes)
        return data, mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def _read_file(path: Path, limit: int) -> bytes:
    try:
        if path.stat().st_size > limit:
            raise PayloadTooLargeError("object_too_large", f"{path} has more than {limit} "
                                       "bytes")
        return path.read_bytes()
    except FileNotFoundError:
        raise BadRequestError("missing_object", f"no object at {path}") from None
    except IsADirectoryError:
        raise BadRequestError("missing_object", f"{path} is a directory") from None
    except OSError as exc:
        raise BadRequestError("unreadable_object", f"{path} cannot be read: {exc}") from None


def item_request(item: Item) -> InferRequest:
    """A tensor item's infer request, read but not checked against the model."""
    doc = {"inputs": item.doc["inputs"]}
    if "parameters" in item.doc:
        doc["parameters"] = item.doc["parameters"]
    try:
        return read_infer_request(doc)
    except TensorError as exc:
        raise BadRequestError("invalid_tensors", str(exc)) from None
