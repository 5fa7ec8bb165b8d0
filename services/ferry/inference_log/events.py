"""A record as CloudEvents, as KServe's inference logger sends them (pure: no I/O).

Two events per task, in the HTTP binding's binary mode (the event's attributes in ``ce-*``
headers, its data the body): ``org.kubeflow.serving.inference.request`` with what the model
was asked, then ``org.kubeflow.serving.inference.response`` with its answer (or
``{"error": ...}``), both with the task's id as ``ce-id``, and KServe's extensions
(``inferenceservicename``: the model; ``endpoint``: its version; ``component``: predictor), so
that a collector built for KServe's logger takes them as they are. Ferry's own extensions add
the client, the status and the batch.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
SPEC_VERSION = "1.0"
# What a ce-* header's value keeps as it is: printable ASCII but for the space, '"' and '%'
# (the HTTP binding percent-encodes the rest).
HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%')


@dataclass(frozen=True)
class Event:
    """One CloudEvent in binary mode: its headers and its body."""

    headers: dict[str, str]
    body: bytes


def events_of(record: dict[str, Any]) -> list[Event]:
    """The request and response events of one record (as ``record.record_of`` makes it)."""
    common = {"ce-specversion": SPEC_VERSION, "ce-id": record["id"],
              "ce-source": f"/ferry/models/{record['model']}",
              "ce-inferenceservicename": record["model"], "ce-component": "predictor",
              "ce-endpoint": record["version"] or "default",
              "ce-ferryclient": record["client"], "ce-ferrystatus": record["status"],
              "ce-ferrybatch": record["batch"]["id"],
              "content-type": "application/json"}
    answer = (record["response"] if record["error"] is None
              else {"error": record["error"]})
    return [
        Event(_headers(common, REQUEST_TYPE, record["created_at"]),
              orjson.dumps(record["request"])),
        Event(_headers(common, RESPONSE_TYPE, record["finished_at"] or record["logged_at"]),
              orjson.dumps(answer)),
    ]


def _headers(common: dict[str, str], kind: str, at: float) -> dict[str, str]:
    stamp = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
    found = {**common, "ce-type": kind, "ce-time": stamp}
    return {name: value if name == "content-type" else header_value(value)
            for name, value in found.items()}


def header_value(value: str) -> str:
    """A ce-* attribute as its header carries it (percent-encoded where the binding says)."""
    return urllib.parse.quote(value, safe=HEADER_SAFE)
