"""perf_analyzer, Triton's own load generator, runs against Ferry as it runs against Triton: a few
seconds of Poisson load at a small fixed rate on each protocol, for ``sim`` (one BYTES [1] input)
and ``simple`` (two FP32 [16] inputs), with no error, every request a task of Ferry's and the
tasks run by Triton. Every request's inputs differ (a JSON file of them): perf_analyzer's own
random data is one buffer for every request, which Ferry's result cache would answer.

With its default flags too (its random data, no model version) for ``mix``, a model Ferry's code
was not written around, over both protocols, asynchronous and not, two passes each: its
server-side figures are Ferry's own statistics (every request counted, the result cache's
answers among them), and with the cache off they show Ferry's queue and Triton's calls.

perf_analyzer is not optional here: ``make test`` installs it (``make tools``); a missing one
fails with the command that installs it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ferry.stack.ports import free_port
from loadtest.bench.perf_analyzer import (
    BINARY,
    Load,
    Measurement,
    Protocol,
    bytes_inputs,
    fp32_inputs,
    measure,
)
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batch_executions,
    batcher_settings,
    executions_since,
    ferry_processes,
    gateway_settings,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RATE = 20.0
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def ferry(redis_server: str, triton_server: TritonServer,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A gateway and a batcher: host:port of the gateway for each protocol, and its /metrics."""
    if not BINARY.exists():
        pytest.fail(f"perf_analyzer is not installed at {BINARY}: run `make tools` "
                    "(scripts/install-perf-analyzer.sh)")
    gateway = gateway_settings(redis_server, triton_server.grpc_url, port=free_port(),
                               workers=1)
    batcher = batcher_settings(redis_server, triton_server.grpc_url)
    with ferry_processes(gateway, batcher, tmp_path_factory.mktemp("perf-analyzer")) as url:
        yield {"http": url.removeprefix("http://"), "metrics": f"{url}/metrics",
               "grpc": f"127.0.0.1:{getattr(gateway, 'grpc_port', 0)}"}


def accepted(metrics_url: str, model: str) -> float:
    """Ferry's count of tasks it accepted for ``model`` (every request, shared or not)."""
    text = httpx.get(metrics_url, timeout=10).text
    found = re.search(rf'^ferry_tasks_accepted_total{{model="{model}",version=""}} (\S+)$', text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def run_against_ferry(ferry: dict[str, str], triton: TritonServer, model: str,
                            protocol: Protocol, tmp_path: Path,
                            input_data: Path | None = None) -> Measurement:
    before = (accepted(ferry["metrics"], model), batch_executions(triton.grpc_url, model))
    measured = await measure(Load(ferry[protocol], model, RATE, protocol,
                                  input_data=input_data, interval_ms=1000), tmp_path)
    assert measured.ok, measured.errors
    assert measured.requests >= 20 and measured.throughput > 0.5 * RATE
    assert 0 < measured.p50_ms <= measured.p99_ms < 5000
    # every request perf_analyzer counted was a task of Ferry's, and Triton ran each one (their
    # inputs differ: none was answered from the cache or collapsed onto another)
    assert accepted(ferry["metrics"], model) - before[0] >= measured.requests
    ran = executions_since(before[1], batch_executions(triton.grpc_url, model))
    assert sum(size * n for size, n in ran.items()) >= measured.requests
    return measured


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_perf_analyzer_drives_sim_through_ferry(
        ferry: dict[str, str], triton_server: TritonServer, protocol: Protocol,
        tmp_path: Path) -> None:
    data = bytes_inputs(tmp_path / "sim.json", "INPUT", 400, size=256, tag=f"{protocol}-")
    await run_against_ferry(ferry, triton_server, "sim", protocol, tmp_path, data)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_perf_analyzer_drives_simple_through_ferry(
        ferry: dict[str, str], triton_server: TritonServer, protocol: Protocol,
        tmp_path: Path) -> None:
    data = fp32_inputs(tmp_path / "simple.json", ("INPUT0", "INPUT1"), 16, 400,
                       start=PROTOCOLS.index(protocol) * 400)  # none answered from the cache
    await run_against_ferry(ferry, triton_server, "simple", protocol, tmp_path, data)


# -- perf_analyzer with its default flags ---------------------------------------------------------

DEFAULT_MODEL = "mix"  # FP32 [4] and INT32 [2] in (tests/tensor_models.py)
WINDOW = ["-p", "700", "--max-trials", "3", "-s", "100000"]  # 3 short windows a pass, always
ASYNC_RATES = ["--async", "--request-rate-range", "100:200:100"]  # two passes
SYNC_CONCURRENCY = ["--concurrency-range", "1:2"]  # two passes, one request at a time each
_PASS = re.compile(r"^(?:Request Rate: \S+ inference requests|Request concurrency: \d+)",
                   re.MULTILINE)  # a pass's heading, not its line in the closing summary
_SERVED = re.compile(r"^\s*Successful request count: (\d+)$", re.MULTILINE)
_QUEUE = re.compile(r"\+ queue (\d+) usec \+ compute input \d+ usec \+ compute infer (\d+) usec")


@dataclass(frozen=True)
class ServerSide:
    """What perf_analyzer printed of the server's figures, one entry per pass."""

    passes: int
    served: list[int]
    queue_us: list[int]
    compute_us: list[int]


def server_side(output: str) -> ServerSide:
    breakdown = [(int(q), int(c)) for q, c in _QUEUE.findall(output)]
    return ServerSide(len(_PASS.findall(output)), [int(n) for n in _SERVED.findall(output)],
                      [q for q, _ in breakdown], [c for _, c in breakdown])


async def default_run(url: str, protocol: Protocol, mode: list[str]) -> ServerSide:
    """perf_analyzer on ``mix`` with its defaults (random data, no version), short windows."""
    proc = await asyncio.create_subprocess_exec(
        str(BINARY), "-m", DEFAULT_MODEL, "-u", url, "-i", protocol, *mode, *WINDOW,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    assert proc.returncode == 0 and "failed to find" not in text, text
    return server_side(text)


@pytest.fixture(scope="module")
def uncached(redis_server: str, triton_server: TritonServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A gateway and a batcher that share no answer: every request is queued and batched."""
    gateway = gateway_settings(redis_server, triton_server.grpc_url, port=free_port(),
                               workers=1, cache_ttl_s=0, collapse_requests=False)
    batcher = batcher_settings(redis_server, triton_server.grpc_url)
    with ferry_processes(gateway, batcher, tmp_path_factory.mktemp("uncached")) as url:
        yield {"http": url.removeprefix("http://"),
               "grpc": f"127.0.0.1:{getattr(gateway, 'grpc_port', 0)}"}


@pytest.mark.parametrize(("protocol", "mode"), [("http", ASYNC_RATES),
                                                ("grpc", SYNC_CONCURRENCY)],
                         ids=["http-async", "grpc-sync"])
async def test_default_flags_with_the_result_cache(ferry: dict[str, str], protocol: Protocol,
                                                   mode: list[str]) -> None:
    """Its one random buffer is answered by Ferry's cache after the first request: the
    figures count those answers, so every window finds the version that served them."""
    seen = await default_run(ferry[protocol], protocol, mode)
    assert seen.passes == 2 and len(seen.served) == 2 and all(seen.served)


@pytest.mark.parametrize(("protocol", "mode"), [("grpc", ASYNC_RATES),
                                                ("http", SYNC_CONCURRENCY)],
                         ids=["grpc-async", "http-sync"])
async def test_default_flags_show_ferrys_queue_and_tritons_calls(
        uncached: dict[str, str], protocol: Protocol, mode: list[str]) -> None:
    seen = await default_run(uncached[protocol], protocol, mode)
    assert seen.passes == 2 and len(seen.served) == 2 and all(seen.served)
    assert len(seen.queue_us) == 2 and all(seen.queue_us) and all(seen.compute_us)
