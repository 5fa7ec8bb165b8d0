"""A job's item as the submission a client would have made for it, at the job's priority."""

from __future__ import annotations

import asyncio
import base64
import mimetypes
import urllib.parse
from pathlib import Path

import obstore
import obstore.exceptions
from obstore.store import S3Store

from ferry.errors import BadRequestError, PayloadTooLargeError
from ferry.jobs.blobs import S3Keys, s3_store
from ferry.jobs.manifest import Item, Sources
from ferry.oip.request import InferRequest, read_infer_request
from ferry.priority import Priority
from ferry.submission import Submission, TensorForm, TensorSubmission
from ferry.tensors import TensorError


class ItemMaker:
    """Makes submissions of items: reads ``uri`` items from the allowlisted sources."""

    def __init__(self, sources: Sources, max_item_bytes: int, s3_endpoint: str = "",
                 s3_keys: S3Keys | None = None) -> None:
        self.sources = sources
        self.max_item_bytes = max_item_bytes
        self.s3_endpoint = s3_endpoint
        self.s3_keys = s3_keys
        self._buckets: dict[str, S3Store] = {}

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
        parsed = urllib.parse.urlsplit(item.uri)
        path = Path(urllib.parse.unquote(parsed.path))
        if parsed.scheme == "s3":
            data = await self._object(parsed.netloc, path.as_posix().lstrip("/"))
        else:
            data = await asyncio.to_thread(_read_file, path, self.max_item_bytes)
        return data, mimetypes.guess_type(path.name)[0] or "application/octet-stream"

    async def _object(self, bucket: str, key: str) -> bytes:
        """An object of an allowlisted bucket, or a 4xx that names the problem."""
        store = self._buckets.get(bucket)
        if store is None:
            store = self._buckets[bucket] = s3_store(f"s3://{bucket}", self.s3_endpoint,
                                                     self.s3_keys)
        try:
            meta = await obstore.head_async(store, key)
            if int(meta["size"]) > self.max_item_bytes:
                raise PayloadTooLargeError("object_too_large", f"s3://{bucket}/{key} has more "
                                           f"than {self.max_item_bytes} bytes")
            return bytes(await (await obstore.get_async(store, key)).bytes_async())
        except FileNotFoundError:
            raise BadRequestError("missing_object", f"no object s3://{bucket}/{key}") from None
        except obstore.exceptions.BaseError as exc:
            raise BadRequestError("unreadable_object", f"s3://{bucket}/{key} cannot be read: "
                                  f"{exc}") from None


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
