"""Light load, two clients: why a plain Python client sees Ferry further from Triton alone than
``make bench``'s own client does.

One tritonserver (the fast sim backend, one instance), one Redis, a Ferry gateway and batcher
(``BenchStack``, the batcher's calls over gRPC); interleaved rounds at ``--rate`` (50/s) of four
flows: Ferry and Triton alone, each through
``make bench``'s lean client (``loadtest.rawhttp`` for Ferry's ``Prefer: wait``, gRPC for
Triton) and through a plain client (httpx's keep-alive pool; Triton over its REST infer). Each
flow's p50 and p99 (medians over the rounds) and the client's own CPU per request; with
``--busy``, the same again while a spinning process keeps one core awake (whether an idle
machine's wake-ups make the difference). Loopback only.

    .venv/bin/python -m loadtest.bench.clients --rate 50 --seconds 20 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import uvloop

from loadtest.bench.backends import FAST, Scenario, write_repository
from loadtest.bench.stack import BenchStack
from loadtest.generator import run

FLOWS = ("ferry-1req", "ferry-plain", "triton", "triton-plain")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@contextlib.contextmanager
def busy(on: bool, seconds: float) -> Iterator[None]:
    """A process spinning on one core for ``seconds`` (at most), while the block runs."""
    if not on:
        yield
        return
    spinner = multiprocessing.Process(target=_spin, args=(seconds,), daemon=True)
    spinner.start()
    try:
        yield
    finally:
        spinner.terminate()
        spinner.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="also with one core kept awake")
    args = parser.parse_args()
    scenario = Scenario(FAST, 1)
    state = Path(tempfile.mkdtemp(prefix="ferry-clients-"))
    stack = BenchStack(state, write_repository(state / "models", [scenario], 50),
                       infer_over_http=False)
    count = int(args.rate * args.seconds)
    results: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    try:
        stack.start(scenario.name)
        urls = {"ferry-1req": stack.gateway_url, "ferry-plain": stack.gateway_url,
                "triton": stack.triton_grpc, "triton-plain": f"http://{stack.triton_http}"}
        for flow in FLOWS:  # warm up
            uvloop.run(run(flow, urls[flow], scenario.name, 20, 40))
        for round_ in range(args.rounds):
            for awake in (False, True) if args.busy else (False,):
                order = FLOWS if round_ % 2 == 0 else FLOWS[::-1]
                for flow in order:
                    with busy(awake, args.seconds + 30):
                        result = uvloop.run(run(flow, urls[flow], scenario.name, args.rate,
                                                count, seed=21 + round_))
                    results.setdefault((flow, awake), []).append(
                        (result.p50_ms, result.p99_ms,
                         result.generator_cpu_s * 1e6 / count))
    finally:
        stack.stop()
    for (flow, awake), runs in results.items():
        p50, p99, cpu = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"{args.rate:5.0f}/s {flow:13} {'one core kept awake' if awake else 'idle':20}"
              f" p50 {p50:6.2f} p99 {p99:6.2f} ms  client cpu {cpu:5.0f} us/request  "
              f"(p50 of rounds: {' '.join(f'{r[0]:.2f}' for r in runs)})")


if __name__ == "__main__":
    main()
