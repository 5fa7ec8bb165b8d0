"""What ``ferry up`` prints once the stack is up: where each piece is, and a first request that
the default model accepts, its input in the form the model's config asks for.

Pure code over the settings and the model's ``config.pbtxt`` text: a repository without the
bundled ``moderation`` gets an example for the model it does serve, never a 404.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ferry.settings import UpSettings
from ferry.triton.base import INPUT_KIND_PARAMETER

MAX_INLINE_TENSOR = 300  # characters of a tensor-form body still shown in the banner itself


@dataclass(frozen=True)
class FirstRequest:
    """A request the model accepts: what it sends (``what``), the curl that sends it, and, for a
    tensor form too long to show, the body curl reads from ``body_path`` (``body`` to write)."""

    what: str
    curl: str
    body: bytes = b""


def model_config_text(repository: Path, model: str) -> str | None:
    """The text of ``model``'s config in ``repository`` (None: it has none there)."""
    path = repository / model / "config.pbtxt"
    return path.read_text() if path.is_file() else None


def first_request(base: str, model: str, config_text: str | None, image: Path,
                  body_path: Path) -> FirstRequest:
    """The first request for ``model``: the sample photo to an image model, a text to any
    other model of Ferry's one-input contract (or one whose config is not at hand: the gateway
    says what is wrong, if anything), and every input as zeros in the JSON tensor form to a
    model of tensors (its body in ``body_path`` when it is too long for one line)."""
    url = shlex.quote(f"{base}/v1/inference?model={model}")
    config = _parse(config_text)
    form = "text" if config is None else _payload_form(config)
    if form == "image":
        return FirstRequest("an image", "curl -s -H 'Content-Type: image/jpeg' --data-binary "
                            f"{shlex.quote(f'@{image}')} {url}")
    if form == "text":
        return FirstRequest("a text", "curl -s -H 'Content-Type: text/plain' --data-binary "
                            f"'hello' {url}")
    body = json.dumps({"inputs": tensor_inputs(config)}, separators=(", ", ": "))
    json_header = "curl -s -H 'Content-Type: application/json'"
    if len(body) <= MAX_INLINE_TENSOR:
        return FirstRequest("its inputs as tensors", f"{json_header} -d {shlex.quote(body)} {url}")
    return FirstRequest("its inputs as tensors", f"{json_header} "
                        f"--data-binary {shlex.quote(f'@{body_path}')} {url}", body.encode())


def _parse(config_text: str | None) -> Any | None:
    """The config as Triton's ModelConfig message (None: none, or text it cannot read)."""
    if config_text is None:
        return None
    try:
        return text_format.Parse(config_text, model_config_pb2.ModelConfig())
    except text_format.ParseError:
        return None


def _payload_form(config: Any) -> str:
    """``image`` or ``text`` for a model of Ferry's contract (one BYTES input of dims [1],
    batched), else ``tensors``."""
    inputs = list(config.input)
    if (len(inputs) != 1 or inputs[0].data_type != model_config_pb2.TYPE_STRING
            or list(inputs[0].dims) != [1] or config.max_batch_size <= 0):
        return "tensors"
    kind = config.parameters[INPUT_KIND_PARAMETER].string_value \
        if INPUT_KIND_PARAMETER in config.parameters else ""
    return "image" if kind == "image" else "text"


def tensor_inputs(config: Any) -> list[dict[str, Any]]:
    """Each input of the config as a tensor of the JSON tensor form: one row when the model
    batches, a variable dimension as 1, every element zero (false, or 'hello' for BYTES)."""
    tensors = []
    for tensor in config.input:
        datatype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        datatype = "BYTES" if datatype == "STRING" else datatype
        shape = [1] * (config.max_batch_size > 0) + [max(1, int(d)) for d in tensor.dims]
        zero: Any = {"BYTES": "hello", "BOOL": False}.get(datatype, 0)
        tensors.append({"name": tensor.name, "datatype": datatype, "shape": shape,
                        "data": [zero] * math.prod(shape)})
    return tensors


def redis_line(s: UpSettings) -> str:
    """The Redis the stack uses, as its settings reach it."""
    if s.redis_sentinels:  # the URL's host is not used: the sentinels name the master
        return f"master {s.redis_sentinel_master!r} of sentinels {s.redis_sentinels}"
    return s.redis_url + (" (a Redis Cluster)" if s.redis_cluster else "")


def banner(s: UpSettings, logs: Path, admin_token_file: Path, request: FirstRequest) -> str:
    """The lines ``ferry up`` prints once every piece is ready."""
    base = f"http://{s.host}:{s.port}"
    return "\n".join([
        "",
        f"Ferry is up: gateway {base}  (API docs {base}/docs, metrics {base}/metrics)",
        f"  Triton's protocol  HTTP {base}/v2, gRPC "
        f"{f'{s.host}:{s.grpc_port}' if s.grpc_port else 'off'}",
        f"  default model  {s.default_model}",
        f"  redis          {redis_line(s)}",
        f"  triton         gRPC {s.triton_url}"
        + (f", infer calls over HTTP {s.triton_http_url}" if s.triton_http_url else ""),
        f"  batcher        metrics http://{s.metrics_host}:{s.metrics_port}/metrics",
        *([f"  logger         metrics http://{s.metrics_host}:{s.log_metrics_port}/metrics, "
           f"records in {s.log_sink}"] if s.log_rates else []),
        f"  admin token    {admin_token_file} (ferry rollout reads it)",
        f"  job sources    {s.job_sources or 'none (FERRY_JOB_SOURCES)'}",
        f"  logs           {logs}",
        "",
        f"Try it ({request.what} to the {s.default_model} model, then its result):",
        f"  {request.curl}",
        f"  curl -s '{base}/v1/result/<task_id>?wait=10'",
        "",
        "Ctrl-C stops everything.",
    ])
