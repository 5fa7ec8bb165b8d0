"""What every peer shares: its command line, and the one gRPC call a batch makes to Triton.

The call is what a user of ``tritonclient`` writes (``tritonclient.grpc.aio``, a numpy array
of BYTES, ``as_numpy`` on the answer), so each peer pays the same client cost.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient

PREDICT_PATH = "/predict"


@dataclass(frozen=True)
class PeerArgs:
    """One peer's settings, the same for every peer."""

    port: int
    triton: str  # host:port of Triton's gRPC endpoint
    model: str
    workers: int
    max_batch: int
    max_wait_ms: float
    host: str = "127.0.0.1"

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0


def parse(argv: Sequence[str] | None = None, description: str = "") -> PeerArgs:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--triton", required=True, help="Triton's gRPC host:port")
    parser.add_argument("--model", required=True)
    parser.add_argument("--workers", type=int, default=2, help="serving processes")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=50.0)
    ns = parser.parse_args(argv)
    return PeerArgs(ns.port, ns.triton, ns.model, ns.workers, ns.max_batch, ns.max_wait_ms)


class Triton:
    """A worker's client of Triton: one ``infer`` per batch of texts, the answers in order."""

    def __init__(self, url: str, model: str) -> None:
        self.model = model
        self.client = InferenceServerClient(url)
        self.outputs = [InferRequestedOutput("OUTPUT")]

    async def infer_batch(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        batch = np.array([[t.encode()] for t in texts], dtype=np.object_)
        tensor = InferInput("INPUT", list(batch.shape), "BYTES")
        tensor.set_data_from_numpy(batch)
        result = await self.client.infer(self.model, [tensor], outputs=self.outputs)
        answers = result.as_numpy("OUTPUT")
        return [json.loads(row[0]) for row in answers.reshape(len(texts), -1)]

    async def close(self) -> None:
        await self.client.close()
