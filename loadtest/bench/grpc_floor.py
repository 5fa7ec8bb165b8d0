"""Triton's gRPC protocol: what Ferry's gateway costs per ModelInfer against a bare grpc.aio
server that answers each call at once (the floor a Python gRPC front can reach).

One tritonserver (the fast sim backend, one instance), one Redis, a Ferry gateway and batcher
(``BenchStack``, the batcher's calls over gRPC), and a bare server in a process of its own
(``GRPCInferenceService.ModelInfer`` only: it answers the sim model's reply, the input's
SHA-256, with no queue behind it). The same open-loop gRPC
client drives each at each rate, interleaved over the rounds; reported: p50 and p99, and the
server side's CPU per call (the bare process; Ferry's gateway, and its batcher and Redis).
Every request's input is distinct, so that Ferry's result cache never answers. Loopback only.

    .venv/bin/python -m loadtest.bench.grpc_floor --rates 400,1200 --seconds 10 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

import grpc
import uvloop
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.process import ManagedProcess
from loadtest.bench.backends import FAST, Scenario, write_repository
from loadtest.bench.cpu import cpu_seconds, family
from loadtest.bench.stack import BenchStack
from loadtest.generator import run


class Bare(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """ModelInfer answered at once with the sim model's reply for the input."""

    async def ModelInfer(self, request: service_pb2.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> service_pb2.ModelInferResponse:
        data = request.raw_input_contents[0][4:]
        answer = json.dumps({"sha256": hashlib.sha256(data).hexdigest(),
                             "length": len(data)}).encode()
        response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        output = response.outputs.add()
        output.name, output.datatype = "OUTPUT", "BYTES"
        output.shape.extend((1, 1))
        response.raw_output_contents.append(len(answer).to_bytes(4, "little") + answer)
        return response


async def serve_bare(port: int) -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Bare(), server)
    server.add_insecure_port(f"{LOOPBACK}:{port}")
    await server.start()
    await server.wait_for_termination()


def start_bare(state: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = ManagedProcess("bare-grpc", [sys.executable, "-m", "loadtest.bench.grpc_floor",
                                        "--serve-bare", str(port)],
                          log_path=state / "bare.log")
    proc.start()
    target = f"{LOOPBACK}:{port}"
    uvloop.run(_until_serving(target))
    return proc, target


async def _until_serving(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="400,1200")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-bare", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        uvloop.run(serve_bare(args.serve_bare))
        return
    scenario = Scenario(FAST, 1)
    state = Path(tempfile.mkdtemp(prefix="ferry-grpc-floor-"))
    stack = BenchStack(state, write_repository(state / "models", [scenario], 50),
                       infer_over_http=False)
    results: dict[tuple[str, float], list[tuple[float, float, float, float]]] = {}
    try:
        stack.start(scenario.name)
        bare, bare_target = start_bare(state)
        stack.processes.append(bare)
        # Not Triton alone: the sim model takes one request per call on one instance there and
        # falls behind at these rates, and the backlog it leaves in Triton would delay the
        # Ferry run that follows it (Ferry's batches go to the same server).
        targets = {"bare": (bare_target, family(bare.pid or 0)),
                   "ferry": (stack.gateway_grpc, stack.pids["gateway"])}
        helpers = stack.pids["batcher"] + stack.pids["redis"]
        for target, _ in targets.values():  # warm up
            uvloop.run(run("triton", target, scenario.name, 50, 100))
        rates = [float(r) for r in args.rates.split(",")]
        for round_ in range(args.rounds):
            order = list(targets.items())
            for name, (target, own) in order if round_ % 2 == 0 else order[::-1]:
                for rate in rates:
                    count = int(rate * args.seconds)
                    others = helpers if name == "ferry" else []
                    before = (sum(map(cpu_seconds, own)), sum(map(cpu_seconds, others)))
                    result = uvloop.run(run("triton", target, scenario.name, rate, count,
                                            seed=5 + round_))
                    used = (sum(map(cpu_seconds, own)) - before[0],
                            sum(map(cpu_seconds, others)) - before[1])
                    results.setdefault((name, rate), []).append(
                        (result.p50_ms, result.p99_ms, used[0] * 1e6 / count,
                         used[1] * 1e6 / count))
    finally:
        stack.stop()
    for (name, rate), runs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p50, p99, cpu, rest = (statistics.median(r[i] for r in runs) for i in range(4))
        extra = f" (+ batcher and Redis {rest:5.0f})" if name == "ferry" else ""
        print(f"{rate:6.0f}/s {name:7} p50 {p50:6.2f} p99 {p99:7.2f} ms  server CPU per call "
              f"{cpu:5.0f} us{extra}  (rounds: {' '.join(f'{r[2]:.0f}' for r in runs)})")


if __name__ == "__main__":
    main()
