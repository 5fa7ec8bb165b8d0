"""The client matrix (issue 16, item 6): ``tritonclient`` code pointed at Ferry gets what the same
code gets from the same Triton directly, for models of every kind of tensor
(``tests/tensor_models.py``: INT8 and BYTES, FP16 and BF16, mixed datatypes, no batching) and
the moderation ensemble's engine step (``moderation_trt``, FP32 [3, 320, 320] under
onnxruntime): the same outputs as numpy arrays, dtype and bytes, and the same response fields.
Ferry batches what Triton's statistics then count in fewer executions than requests; a model
that does not batch gets one request a call; a bad tensor is a 400 that says what differs, and
nothing is enqueued for it.

Each kind of client is an adapter (``Client``) that runs one infer and returns the outputs as
numpy arrays with the response's fields, so another kind (a stream's, say) is one more entry of
``CLIENTS``, and every model is tried with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import numpy.typing as npt
import orjson
import pytest
import redis
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_http_aio
from tritonclient.utils import triton_to_np_dtype

from ferry.stack.ports import LOOPBACK
from tests.conftest import TritonServer
from tests.integration.helpers import (
    backlog_counts,
    batcher_settings,
    ferry_processes,
    gateway_settings,
    stream_lengths,
    task_keys,
)

pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(180),
    # tritonclient.http.aio hands aiohttp a whole image batch as bytes, which aiohttp warns of
    pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning"),
]
Array = npt.NDArray[Any]
Request = tuple[bytes, dict[str, str]]  # a body and its headers

# Triton's HTTP endpoint takes and gives these only as binary data ("... via JSON is not supported")
BINARY_ONLY = frozenset({"FP16", "BF16"})


@dataclass(frozen=True)
class Server:
    """Where a server speaks each protocol: host:port."""

    http: str
    grpc: str


@dataclass(frozen=True)
class Feed:
    """One input to send: its name, datatype and values (their shape is the tensor's)."""

    name: str
    datatype: str
    values: Array


@dataclass(frozen=True)
class Call:
    """One infer call, as any client kind makes it."""

    model: str
    feeds: tuple[Feed, ...]
    outputs: tuple[str, ...] = ()  # asked for, in this order; (): every output
    binary: bool = True  # over HTTP: inputs and outputs as binary data (False: JSON)
    request_id: str = "matrix"


@dataclass(frozen=True)
class Answer:
    """What a client got: the response's fields and each output as numpy gives it."""

    model_name: str
    model_version: str
    id: str
    outputs: list[tuple[str, str, list[int]]]  # name, datatype, shape, in the response's order
    arrays: dict[str, Array] = field(compare=False)


@dataclass(frozen=True)
class Client:
    """A kind of client: ``infer`` runs a call against a server; ``forms``: the binary flags
    worth trying (gRPC carries raw bytes whatever the flag)."""

    name: str
    infer: Callable[[Server, Call], Awaitable[Answer]]
    forms: tuple[bool, ...] = (False, True)


def http_tensors(call: Call) -> tuple[list[Any], list[Any] | None]:
    inputs = []
    for feed in call.feeds:
        tensor = triton_http.InferInput(feed.name, list(feed.values.shape), feed.datatype)
        tensor.set_data_from_numpy(feed.values,
                                   binary_data=call.binary or feed.datatype in BINARY_ONLY)
        inputs.append(tensor)
    outputs = [triton_http.InferRequestedOutput(name, binary_data=call.binary)
               for name in call.outputs]
    return inputs, outputs or None


def http_answer(result: Any) -> Answer:
    response = result.get_response()
    described = response["outputs"]
    return Answer(response["model_name"], response["model_version"], response.get("id", ""),
                  [(o["name"], o["datatype"], list(o["shape"])) for o in described],
                  {o["name"]: result.as_numpy(o["name"]) for o in described})


def grpc_tensors(call: Call) -> tuple[list[Any], list[Any] | None]:
    inputs = []
    for feed in call.feeds:
        tensor = triton_grpc.InferInput(feed.name, list(feed.values.shape), feed.datatype)
        tensor.set_data_from_numpy(feed.values)
        inputs.append(tensor)
    return inputs, [triton_grpc.InferRequestedOutput(name) for name in call.outputs] or None


def grpc_answer(result: Any) -> Answer:
    response = result.get_response()
    return Answer(response.model_name, response.model_version, response.id,
                  [(o.name, o.datatype, list(o.shape)) for o in response.outputs],
                  {o.name: result.as_numpy(o.name) for o in response.outputs})


def _http_sync(server: Server, call: Call) -> Answer:
    inputs, outputs = http_tensors(call)
    with triton_http.InferenceServerClient(server.http, network_timeout=60) as client:
        return http_answer(client.infer(call.model, inputs, outputs=outputs,
                                        request_id=call.request_id))


async def _http_aio(server: Server, call: Call) -> Answer:
    inputs, outputs = http_tensors(call)
    client = triton_http_aio.InferenceServerClient(server.http)
    try:
        return http_answer(await client.infer(call.model, inputs, outputs=outputs,
                                              request_id=call.request_id))
    finally:
        await client.close()


def _grpc_sync(server: Server, call: Call) -> Answer:
    inputs, outputs = grpc_tensors(call)
    with triton_grpc.InferenceServerClient(server.grpc) as client:
        return grpc_answer(client.infer(call.model, inputs, outputs=outputs,
                                        request_id=call.request_id, client_timeout=60))


async def _grpc_aio(server: Server, call: Call) -> Answer:
    inputs, outputs = grpc_tensors(call)
    async with triton_grpc_aio.InferenceServerClient(server.grpc) as client:
        return grpc_answer(await client.infer(call.model, inputs, outputs=outputs,
                                              request_id=call.request_id, client_timeout=60))


def threaded(run: Callable[[Server, Call], Answer]) -> Callable[[Server, Call], Awaitable[Answer]]:
    """A blocking client's infer, off the event loop (so that calls may overlap)."""
    return lambda server, call: asyncio.to_thread(run, server, call)


CLIENTS = [
    Client("http", threaded(_http_sync)),
    Client("http.aio", _http_aio),
    Client("grpc", threaded(_grpc_sync), (True,)),
    Client("grpc.aio", _grpc_aio, (True,)),
]


# -- the models' samples ---------------------------------------------------------------------

def int8_bytes(rows: int) -> tuple[Feed, ...]:
    numbers = np.random.default_rng(rows).integers(-128, 128, (rows, 4), dtype=np.int8)
    numbers[0] = [-128, 127, 100, -65]  # doubled, each wraps
    text = np.array([[f"row {i}: ferry".encode()] for i in range(rows)], dtype=np.object_)
    return Feed("NUMBERS", "INT8", numbers), Feed("TEXT", "BYTES", text)


def half(rows: int) -> tuple[Feed, ...]:
    rng = np.random.default_rng(rows)
    scaled = (rng.standard_normal((rows, 8)) * 1000).astype(np.float16)
    scaled[0, :4] = [65504, -6e-8, -0.0, 1e4]  # the largest, a subnormal, -0, one that overflows
    brain = (rng.standard_normal((rows, 8)) * 1e30).astype(ml_dtypes.bfloat16)
    return Feed("HALF", "FP16", scaled), Feed("BRAIN", "BF16", brain)


def mixed(rows: int) -> tuple[Feed, ...]:
    rng = np.random.default_rng(rows)
    counts = rng.integers(-(2**31), 2**31, (rows, 2), dtype=np.int32)
    counts[0] = [-(2**31), 2**31 - 1]  # the smallest negates to itself
    weights = rng.standard_normal((rows, 3))
    weights[0] = [1e300, -0.0, 5e-324]
    codes = rng.integers(0, 2**16, (rows, 5), dtype=np.uint16)
    codes[0, :2] = [0, 65535]
    return Feed("COUNTS", "INT32", counts), Feed("WEIGHTS", "FP64", weights), Feed(
        "CODES", "UINT16", codes)


def nobatch(rows: int) -> tuple[Feed, ...]:
    matrix = np.random.default_rng(rows).integers(-(2**60), 2**60, (rows, 3), dtype=np.int64)
    matrix[0] = [2**60, -(2**60), 2**53 + 1]  # beyond a double's integers
    return (Feed("MATRIX", "INT64", matrix),)


def images(rows: int) -> tuple[Feed, ...]:
    return (Feed("images", "FP32",
                 np.random.default_rng(rows).random((rows, 3, 320, 320), dtype=np.float32)),)


@dataclass(frozen=True)
class Sample:
    """A model and inputs for it: ``feeds(rows)``, the outputs asked for (in an order other
    than the model's, which the answer keeps), and the row counts to try in binary and in JSON
    (none where Triton's HTTP takes the model's datatypes only in binary)."""

    model: str
    feeds: Callable[[int], tuple[Feed, ...]]
    outputs: tuple[str, ...]
    rows: tuple[int, ...] = (1, 3)
    json_rows: tuple[int, ...] = (1, 3)

    def call(self, rows: int, binary: bool = True, request_id: str = "matrix") -> Call:
        return Call(self.model, self.feeds(rows), self.outputs, binary, request_id)


SAMPLES = [
    Sample("int8_bytes", int8_bytes, ("REVERSED", "DOUBLED")),
    Sample("half", half, ("HALF_SCALED", "BRAIN_SCALED"), json_rows=()),
    Sample("mixed", mixed, ("ODD", "TOTAL", "NEGATED")),
    Sample("nobatch", nobatch, ("SUMS", "TRANSPOSED"), (1, 4), (1, 4)),  # the matrix's own rows
    Sample("moderation_trt", images, ("output0",), (1, 2), (1,)),  # 300k numbers an image
]


def matrix() -> Iterator[Any]:
    for client in CLIENTS:
        for sample in SAMPLES:
            for binary in client.forms:
                for rows in sample.rows if binary else sample.json_rows:
                    form = "binary" if binary else "json"
                    yield pytest.param(client, sample, rows, binary,
                                       id=f"{sample.model}-{client.name}-{form}-{rows}")


def assert_same_arrays(ours: dict[str, Array], theirs: dict[str, Array]) -> None:
    """The same outputs: names, dtypes, shapes, and every element's bytes (BYTES: each
    element's)."""
    assert ours.keys() == theirs.keys()
    for name, mine in ours.items():
        other = theirs[name]
        assert (mine.dtype, mine.shape) == (other.dtype, other.shape), name
        if mine.dtype == np.object_:
            assert mine.tolist() == other.tolist(), name
        else:
            assert mine.tobytes() == other.tobytes(), name


# -- servers ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ferry(redis_server: str, triton_server: TritonServer,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway and a batcher; the batcher waits up to 40 ms for a batch's company."""
    gateway = gateway_settings(redis_server, triton_server.grpc_url, workers=1,
                               max_body_bytes=32 * 1024 * 1024)
    batcher = batcher_settings(redis_server, triton_server.grpc_url, max_wait_ms=40,
                               adaptive_flush=False)
    with ferry_processes(gateway, batcher, tmp_path_factory.mktemp("oip-models")) as url:
        yield Server(url.removeprefix("http://"), f"{LOOPBACK}:{gateway.grpc_port}")


@pytest.fixture(scope="module")
def direct(triton_server: TritonServer) -> Server:
    """The same Triton, directly."""
    return Server(f"{LOOPBACK}:{triton_server.ports.http}", triton_server.grpc_url)


# -- the matrix ------------------------------------------------------------------------------

@pytest.mark.parametrize(("client", "sample", "rows", "binary"), list(matrix()))
async def test_ferry_answers_as_triton(ferry: Server, direct: Server, client: Client,
                                       sample: Sample, rows: int, binary: bool) -> None:
    call = sample.call(rows, binary)
    ours, theirs = await client.infer(ferry, call), await client.infer(direct, call)
    assert ours == theirs  # model_name, model_version, id, each output's name, datatype, shape
    assert sorted(name for name, _, _ in ours.outputs) == sorted(sample.outputs)
    assert_same_arrays(ours.arrays, theirs.arrays)


@pytest.mark.parametrize("sample", SAMPLES, ids=[sample.model for sample in SAMPLES])
def test_a_binary_answer_is_tritons_byte_for_byte(ferry: Server, direct: Server,
                                                  sample: Sample) -> None:
    call = sample.call(2)
    body, headers = tensor_body(sample.model, *call.feeds, outputs=call.outputs,
                                request_id=call.request_id)
    answers = [httpx.post(f"http://{server.http}/v2/models/{sample.model}/infer", content=body,
                          headers=headers, timeout=60) for server in (ferry, direct)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
    ours, theirs = answers
    assert ours.content == theirs.content
    assert (ours.headers["inference-header-content-length"]
            == theirs.headers["inference-header-content-length"])


def test_fp16_and_bf16_as_json_are_answered_where_triton_takes_only_binary(
        ferry: Server, direct: Server) -> None:
    """Beyond Triton: FP16 and BF16 data in JSON, in and out, read and written exactly."""
    halves, brains = half(2)
    inputs = [{"name": feed.name, "datatype": feed.datatype, "shape": list(feed.values.shape),
               "data": feed.values.astype(np.float64).flatten().tolist()}
              for feed in (halves, brains)]
    body = {"inputs": inputs, "outputs": [{"name": "HALF_SCALED"}, {"name": "BRAIN_SCALED"}]}
    refused = httpx.post(f"http://{direct.http}/v2/models/half/infer", json=body, timeout=60)
    assert refused.status_code == 400 and "not supported" in refused.json()["error"]
    answer = httpx.post(f"http://{ferry.http}/v2/models/half/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    data = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    binary = _http_sync(direct, Call("half", (halves, brains))).arrays
    for name, dtype in (("HALF_SCALED", np.float16), ("BRAIN_SCALED", ml_dtypes.bfloat16)):
        assert np.array(data[name], dtype).tobytes() == binary[name].tobytes(), name


def test_bytes_that_are_not_utf8_come_back_in_binary_when_json_was_asked(
        ferry: Server, direct: Server) -> None:
    """Triton writes such BYTES into its JSON as they are, which tritonclient cannot read;
    Ferry sends that output as binary data instead, which it can."""
    feeds = (Feed("NUMBERS", "INT8", np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.int8)),
             Feed("TEXT", "BYTES", np.array([["wörld".encode()], [b"ok"]], dtype=np.object_)))
    inputs, _ = http_tensors(Call("int8_bytes", feeds))
    asked = [triton_http.InferRequestedOutput(name, binary_data=False)
             for name in ("DOUBLED", "REVERSED")]
    with triton_http.InferenceServerClient(ferry.http) as client:
        answer = client.infer("int8_bytes", inputs, outputs=asked)
    described = {o["name"]: o for o in answer.get_response()["outputs"]}
    assert "data" in described["DOUBLED"] and "data" not in described["REVERSED"]
    theirs = _http_sync(direct, Call("int8_bytes", feeds, ("DOUBLED", "REVERSED")))
    assert answer.as_numpy("REVERSED").tolist() == theirs.arrays["REVERSED"].tolist() == [
        ["wörld".encode()[::-1]], [b"ko"]]
    assert answer.as_numpy("DOUBLED").tobytes() == theirs.arrays["DOUBLED"].tobytes()


# -- batching --------------------------------------------------------------------------------

def counts(triton: triton_http.InferenceServerClient, model: str) -> tuple[int, int]:
    """Triton's inference (rows) and execution counts for the model, so far."""
    (stats,) = triton.get_inference_statistics(model)["model_stats"]
    return int(stats["inference_count"]), int(stats["execution_count"])


async def counted_since(triton: triton_http.InferenceServerClient, model: str,
                        before: tuple[int, int], rows: int, timeout_s: float = 10.0
                        ) -> tuple[int, int]:
    """The rows and executions Triton has counted since ``before``, read once it has counted
    ``rows`` rows or ``timeout_s`` has passed: Triton counts an execution after its answer
    went out, so a read just after the last answer can miss the last execution."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = counts(triton, model)
        if now[0] - before[0] >= rows or time.monotonic() > deadline:
            return now[0] - before[0], now[1] - before[1]
        await asyncio.sleep(0.02)


async def test_concurrent_requests_reach_triton_in_fewer_executions(
        ferry: Server, triton: triton_http.InferenceServerClient) -> None:
    client = next(c for c in CLIENTS if c.name == "http.aio")
    calls = [Call("int8_bytes", (
        Feed("NUMBERS", "INT8", np.full((1, 4), i * 20 - 128, dtype=np.int8)),
        Feed("TEXT", "BYTES", np.array([[f"request {i}".encode()]], dtype=np.object_))),
        request_id=f"r-{i}") for i in range(16)]
    before = counts(triton, "int8_bytes")
    answers = await asyncio.gather(*(client.infer(ferry, call) for call in calls))
    rows, executions = await counted_since(triton, "int8_bytes", before, len(calls))
    for i, answer in enumerate(answers):
        assert answer.id == f"r-{i}"
        expected = (np.full((1, 4), i * 20 - 128, dtype=np.int8) * np.int8(2)).astype(np.int8)
        assert answer.arrays["DOUBLED"].tobytes() == expected.tobytes()
        assert answer.arrays["REVERSED"].tolist() == [[f"request {i}".encode()[::-1]]]
    assert rows == len(calls)
    assert executions < len(calls), "no request travelled with another"


async def test_a_model_that_does_not_batch_gets_one_request_a_call(
        ferry: Server, triton: triton_http.InferenceServerClient) -> None:
    """Concurrent requests of other shapes ([n, 3]: no batch dimension), each answered as
    itself, in as many executions as requests."""
    client = next(c for c in CLIENTS if c.name == "http.aio")
    matrices = [np.arange(3 * n, dtype=np.int64).reshape(n, 3) * n for n in range(1, 7)]
    before = counts(triton, "nobatch")
    answers = await asyncio.gather(*(client.infer(ferry, Call(
        "nobatch", (Feed("MATRIX", "INT64", m),))) for m in matrices))
    for matrix_, answer in zip(matrices, answers, strict=True):
        assert np.array_equal(answer.arrays["TRANSPOSED"], matrix_.T)
        assert np.array_equal(answer.arrays["SUMS"], matrix_.sum(axis=0))
    assert await counted_since(triton, "nobatch", before, len(matrices)) == (6, 6)


# -- bad tensors -----------------------------------------------------------------------------

JsonInput = tuple[str, str, list[int], list[Any]]  # name, datatype, shape, data


def tensor_body(model: str, *feeds: Feed, outputs: Sequence[str] = (),
                shapes: dict[str, list[int]] | None = None, request_id: str = "") -> Request:
    """The binary body tritonclient.http sends for these feeds, each input declared with the
    shape ``shapes`` gives it, if any, instead of its values'; and its headers."""
    inputs, asked = http_tensors(Call(model, feeds, tuple(outputs)))
    for tensor in inputs:
        tensor.set_shape((shapes or {}).get(tensor.name(), tensor.shape()))
    body, json_size = triton_http.InferenceServerClient.generate_request_body(
        inputs, asked, request_id=request_id)
    return body, {"inference-header-content-length": str(json_size)}


def json_body(*inputs: JsonInput) -> Request:
    """A JSON body of (name, datatype, shape, data) inputs, data as given."""
    return orjson.dumps({"inputs": [{"name": n, "datatype": d, "shape": s, "data": data}
                                    for n, d, s, data in inputs]}), {}


def cut_last_element(request: Request) -> Request:
    """The request with its last BYTES element's length longer than the bytes after it."""
    body, headers = request
    return body[:-9] + (100).to_bytes(4, "little") + body[-5:], headers  # a 5-byte element


def zeros(name: str, datatype: str, shape: Sequence[int]) -> Feed:
    dtype = ml_dtypes.bfloat16 if datatype == "BF16" else triton_to_np_dtype(datatype)
    return Feed(name, datatype, np.zeros(shape, dtype=dtype))


def words(*elements: bytes) -> Feed:
    return Feed("TEXT", "BYTES", np.array([[e] for e in elements], dtype=np.object_))


@dataclass(frozen=True)
class Bad:
    """A request that does not fit its model: what Ferry's 400 says, and Triton's status."""

    model: str
    request: Callable[[], Request]
    reason: str
    triton: int = 400


INT8, TEXT = zeros("NUMBERS", "INT8", (1, 4)), words(b"hello")
MIXED_OK: list[JsonInput] = [("COUNTS", "INT32", [1, 2], [1, 2]),
                             ("WEIGHTS", "FP64", [1, 3], [0.5, 1.0, 2.0])]
BAD: dict[str, Bad] = {
    "INT8 sent as INT16": Bad("int8_bytes", lambda: tensor_body(
        "int8_bytes", zeros("NUMBERS", "INT16", (1, 4)), TEXT), "datatype INT16"),
    "INT8 of another shape": Bad("int8_bytes", lambda: tensor_body(
        "int8_bytes", zeros("NUMBERS", "INT8", (1, 5)), TEXT), "shape [1, 5]"),
    "INT8 short of its shape": Bad("int8_bytes", lambda: tensor_body(
        "int8_bytes", INT8, words(b"a", b"b"), shapes={"NUMBERS": [2, 4]}),
        "takes 8 bytes, its data has 4"),
    "BYTES with more elements than its shape": Bad("int8_bytes", lambda: tensor_body(
        "int8_bytes", INT8, words(b"a", b"b"), shapes={"TEXT": [1, 1]}),
        "holds 1 elements, its data 2"),
    "BYTES element cut short": Bad("int8_bytes", lambda: cut_last_element(tensor_body(
        "int8_bytes", INT8, TEXT)), "ends inside an element"),
    "unknown input": Bad("int8_bytes", lambda: tensor_body(
        "int8_bytes", INT8, TEXT, zeros("EXTRA", "INT8", (1, 4))), "no input 'EXTRA'"),
    "missing input": Bad("int8_bytes", lambda: tensor_body("int8_bytes", INT8),
                         "'TEXT' is missing"),
    "unknown output": Bad("int8_bytes", lambda: tensor_body(
        "int8_bytes", INT8, TEXT, outputs=["DOUBLED", "HALVED"]), "no output 'HALVED'"),
    "FP16 short of its shape": Bad("half", lambda: tensor_body(
        "half", zeros("HALF", "FP16", (1, 7)), zeros("BRAIN", "BF16", (1, 8)),
        shapes={"HALF": [1, 8]}), "takes 16 bytes, its data has 14"),
    "BF16 sent as FP32": Bad("half", lambda: tensor_body(
        "half", zeros("HALF", "FP16", (1, 8)), zeros("BRAIN", "FP32", (1, 8))),
        "datatype FP32"),
    "inputs that disagree on rows": Bad("mixed", lambda: tensor_body(
        "mixed", zeros("COUNTS", "INT32", (2, 2)), zeros("WEIGHTS", "FP64", (1, 3)),
        zeros("CODES", "UINT16", (2, 5))), "disagree on the request's rows"),
    "UINT16 beyond its range": Bad("mixed", lambda: json_body(
        *MIXED_OK, ("CODES", "UINT16", [1, 2], [1, 70000])), "UINT16 holds 0 to 65535",
        triton=200),  # Triton takes 70000 as 4464
    "FP64 given text": Bad("mixed", lambda: json_body(
        MIXED_OK[0], ("WEIGHTS", "FP64", [1, 3], ["a", "b", "c"]),
        ("CODES", "UINT16", [1, 1], [1])), "FP64 data must be numbers",
        triton=500),
    "a batch dimension where the model has none": Bad("nobatch", lambda: tensor_body(
        "nobatch", zeros("MATRIX", "INT64", (1, 2, 3))), "shape [1, 2, 3]"),
    "INT64 sent as UINT64": Bad("nobatch", lambda: tensor_body(
        "nobatch", zeros("MATRIX", "UINT64", (2, 3))), "datatype UINT64"),
    "an image of another size": Bad("moderation_trt", lambda: tensor_body(
        "moderation_trt", zeros("images", "FP32", (1, 3, 320, 256))),
        "shape [1, 3, 320, 256]"),
    "an image in FP16": Bad("moderation_trt", lambda: tensor_body(
        "moderation_trt", zeros("images", "FP16", (1, 3, 320, 320))), "datatype FP16"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_tensor_is_refused_and_nothing_is_enqueued(
        ferry: Server, direct: Server, store: redis.Redis, case: str) -> None:
    bad = BAD[case]
    body, headers = bad.request()
    before = (len(task_keys(store)), stream_lengths(store), backlog_counts(store))
    answers = [httpx.post(f"http://{server.http}/v2/models/{bad.model}/infer", content=body,
                          headers=headers, timeout=60) for server in (ferry, direct)]
    statuses = [answer.status_code for answer in answers]
    assert statuses == [400, bad.triton], [answer.text for answer in answers]
    assert bad.reason in answers[0].json()["error"]
    assert (len(task_keys(store)), stream_lengths(store), backlog_counts(store)) == before
