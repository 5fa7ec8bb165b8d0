"""What one simulated client does for one inference, for each system the benchmark drives.

Each flow sends a distinct 2 KB payload and checks that the answer is for that payload (the sim
model answers with the payload's SHA-256), so a wrong answer counts as an error, not a success.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
import httpx
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtest.rawhttp import Pool, Response

PAYLOAD_BYTES = 2048
POLL_WAIT_S = 10
MAX_POLLS = 3  # a result not final after three long-polls (30 s) counts as a timeout
PEER_PATH = "/predict"  # loadtest.peers.common.PREDICT_PATH (that package needs the peers' venv)


def payload(index: int, size: int = PAYLOAD_BYTES, nonce: str = "") -> bytes:
    """A distinct payload of ``size`` bytes for request ``index`` of the run named ``nonce``
    (distinct across runs too, so that Ferry's result cache never answers a benchmark)."""
    head = f"load-{nonce}-{index}-".encode()
    return head + b"x" * max(0, size - len(head))


def new_nonce() -> str:
    return secrets.token_hex(6)


def digest_matches(output: Any, data: bytes) -> bool:
    """Whether the sim model's answer ``{"sha256", "length"}`` is for ``data``."""
    return isinstance(output, dict) and output.get("sha256") == hashlib.sha256(data).hexdigest()


class Flow(Protocol):
    """One inference, end to end: its outcome ("SUCCESS", or what went wrong)."""

    async def __call__(self, index: int) -> str: ...

    async def close(self) -> None: ...


def _ferry_outcome(response: Response, data: bytes) -> str:
    body = response.json()
    if body.get("status") != "SUCCESS":
        return str(body.get("status", f"HTTP {response.status}"))
    output = body.get("output", {}).get("OUTPUT")
    return "SUCCESS" if digest_matches(output, data) else "WRONG_ANSWER"


class FerryFlow:
    """``POST /v1/inference`` then ``GET /v1/result/<id>?wait=10`` (the two-request flow), or with
    ``prefer_wait`` one ``POST`` with ``Prefer: wait=10`` that answers with the result."""

    def __init__(self, host: str, port: int, model: str, *, prefer_wait: bool) -> None:
        self.pool = Pool(host, port)
        self.path = f"/v1/inference?model={model}"
        self.headers = [("Prefer", f"wait={POLL_WAIT_S}")] if prefer_wait else []
        self.nonce = new_nonce()

    async def __call__(self, index: int) -> str:
        data = payload(index, nonce=self.nonce)
        response = await self.pool.request("POST", self.path, data, "application/octet-stream",
                                           self.headers)
        if response.status == 200:
            return _ferry_outcome(response, data)
        if response.status != 202:
            return f"HTTP {response.status}"
        url = f"{response.json()['status_url']}?wait={POLL_WAIT_S}"
        for _ in range(MAX_POLLS):
            result = await self.pool.request("GET", url)
            if result.status != 200:
                return f"HTTP {result.status}"
            if result.json().get("status") != "PENDING":
                return _ferry_outcome(result, data)
        return "TIMEOUT"

    async def close(self) -> None:
        await self.pool.close()


class PeerFlow:
    """One ``POST /predict`` of ``{"input": <payload>}`` to a Python peer (``loadtest.peers``),
    answered with the model's output: what a client of Ray Serve, BentoML or LitServe sends."""

    def __init__(self, host: str, port: int) -> None:
        self.pool = Pool(host, port)
        self.nonce = new_nonce()

    async def __call__(self, index: int) -> str:
        data = payload(index, nonce=self.nonce)
        body = json.dumps({"input": data.decode()}).encode()
        response = await self.pool.request("POST", PEER_PATH, body, "application/json")
        if response.status != 200:
            return f"HTTP {response.status}"
        return "SUCCESS" if digest_matches(response.json(), data) else "WRONG_ANSWER"

    async def close(self) -> None:
        await self.pool.close()


class TritonFlow:
    """One gRPC ModelInfer of a [1, 1] BYTES tensor straight to Triton."""

    def __init__(self, target: str, model: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.infer: Callable[..., Awaitable[Any]] = service_pb2_grpc.GRPCInferenceServiceStub(
            self.channel).ModelInfer
        self.model = model
        self.nonce = new_nonce()  # pointed at Ferry's gRPC port, its result cache never answers

    async def __call__(self, index: int) -> str:
        data = payload(index, nonce=self.nonce)
        request = service_pb2.ModelInferRequest(model_name=self.model)
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = "INPUT", "BYTES"
        tensor.shape.extend((1, 1))
        request.outputs.add().name = "OUTPUT"
        request.raw_input_contents.append(len(data).to_bytes(4, "little") + data)
        try:
            response = await self.infer(request, timeout=POLL_WAIT_S * MAX_POLLS)
        except grpc.aio.AioRpcError as exc:
            return f"gRPC {exc.code().name}"
        raw = response.raw_output_contents[0] if response.raw_output_contents else b""
        output = json.loads(raw[4:]) if len(raw) > 4 else None
        return "SUCCESS" if digest_matches(output, data) else "WRONG_ANSWER"

    async def close(self) -> None:
        await self.channel.close()


class PlainFerryFlow:
    """What a plain Python client sends: httpx's keep-alive pool, one ``POST`` with
    ``Prefer: wait`` per task (the light-load comparison of docs/performance.md)."""

    def __init__(self, host: str, port: int, model: str) -> None:
        self.client = httpx.AsyncClient(base_url=f"http://{host}:{port}",
                                        timeout=POLL_WAIT_S * MAX_POLLS)
        self.path = f"/v1/inference?model={model}"
        self.nonce = new_nonce()

    async def __call__(self, index: int) -> str:
        data = payload(index, nonce=self.nonce)
        response = await self.client.post(self.path, content=data, headers={
            "Content-Type": "application/octet-stream", "Prefer": f"wait={POLL_WAIT_S}"})
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        body = response.json()
        if body.get("status") != "SUCCESS":
            return str(body.get("status"))
        output = body.get("output", {}).get("OUTPUT")
        return "SUCCESS" if digest_matches(output, data) else "WRONG_ANSWER"

    async def close(self) -> None:
        await self.client.aclose()


class PlainTritonFlow:
    """The same plain client straight to Triton's REST infer (a [1, 1] BYTES tensor as JSON)."""

    def __init__(self, host: str, port: int, model: str) -> None:
        self.client = httpx.AsyncClient(base_url=f"http://{host}:{port}",
                                        timeout=POLL_WAIT_S * MAX_POLLS)
        self.path = f"/v2/models/{model}/infer"
        self.nonce = new_nonce()

    async def __call__(self, index: int) -> str:
        data = payload(index, nonce=self.nonce)
        response = await self.client.post(self.path, json={
            "inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1],
                        "data": [data.decode()]}],
            "outputs": [{"name": "OUTPUT"}]})
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        raw = response.json()["outputs"][0]["data"][0]
        return "SUCCESS" if digest_matches(json.loads(raw), data) else "WRONG_ANSWER"

    async def close(self) -> None:
        await self.client.aclose()
