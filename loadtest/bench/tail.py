"""Where the slowest requests' time went, at light load: one source tree or several, interleaved.

Each tree's gateway and batcher (``PYTHONPATH`` set to its ``services/``, only the settings every
version knows) run in turn against one tritonserver (the fast sim backend) and one Redis, round
after round. An open-loop client (Poisson arrivals, distinct payloads, keep-alive connections:
``loadtest.rawhttp``) sends ``POST /v1/inference`` with ``Prefer: wait`` and splits each answer's
latency with the record's own timestamps: how late the client itself sent it, from the scheduled
send to the gateway's ``created_at``, from there to the batcher's ``finished_at`` (queue and
Triton), and from there to the answer. The slowest requests of each run are printed so::

    git worktree add /tmp/before <commit>
    .venv/bin/python -m loadtest.bench.tail --trees /tmp/before/services,services \\
        --rate 50 --seconds 40 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop

from ferry.stack.ports import LOOPBACK, free_ports, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.triton_server import start_triton
from loadtest.bench.ab import start_redis_for
from loadtest.bench.backends import FAST, Scenario, write_repository
from loadtest.flows import payload
from loadtest.rawhttp import Pool

WAIT_S = 10  # Prefer: wait


@dataclass(frozen=True)
class Answered:
    """One request's latency, split by the clocks of the client, the gateway and the batcher
    (one machine: one clock)."""

    latency_ms: float  # scheduled send to answer
    late_ms: float  # scheduled send to the client's actual send
    to_admit_ms: float  # scheduled send to the gateway's created_at
    to_finish_ms: float  # created_at to the batcher's finished_at: the queue and Triton
    to_answer_ms: float  # finished_at to the answer
    status: str


async def drive(port: int, model: str, rate: float, count: int, *, nonce: str,
                seed: int) -> list[Answered]:
    """``count`` requests at ``rate`` (Poisson), each answered in full."""
    pool = Pool(LOOPBACK, port)
    rng = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(count):
        at += rng.expovariate(rate)
        offsets.append(at)
    start = time.time() + 0.05
    answered: list[Answered] = []

    async def one(index: int, scheduled: float) -> None:
        began = time.time()
        response = await pool.request(
            "POST", f"/v1/inference?model={model}", payload(index, nonce=nonce),
            "application/octet-stream", [("Prefer", f"wait={WAIT_S}")])
        done = time.time()
        body = response.json()
        created, finished = body.get("created_at") or done, body.get("finished_at") or done
        answered.append(Answered((done - scheduled) * 1e3, (began - scheduled) * 1e3,
                                 (created - scheduled) * 1e3, (finished - created) * 1e3,
                                 (done - finished) * 1e3, str(body.get("status"))))

    sends = []
    for index, offset in enumerate(offsets):
        delay = start + offset - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sends.append(asyncio.ensure_future(one(index, start + offset)))
    await asyncio.gather(*sends)
    await pool.close()
    return answered


def one_tree(tree: str, state: Path, *, redis_url: str, triton: tuple[str, str], model: str,  # noqa: PLR0913 - one run's knobs, keyword-only
             rate: float, seconds: float, nonce: str, seed: int,
             redis_env: dict[str, str] | None = None) -> list[Answered]:
    """Start the tree's batcher and gateway, warm up, run, stop them (``redis_env``: the
    settings that say the Redis is a cluster)."""
    port, grpc_port = free_ports(2)
    base = {"FERRY_REDIS_URL": redis_url, "FERRY_TRITON_URL": triton[0],
            "FERRY_DEFAULT_MODEL": model, "PYTHONPATH": tree, **(redis_env or {})}
    envs = {"batcher": {**base, "FERRY_METRICS_PORT": "0", "FERRY_TRITON_HTTP_URL": triton[1]},
            "gateway": {**base, "FERRY_PORT": str(port), "FERRY_GRPC_PORT": str(grpc_port)}}
    procs = [ManagedProcess(name, [sys.executable, "-m", "ferry", name], env=env_with(env),
                            log_path=state / f"{name}.log") for name, env in envs.items()]
    for proc in procs:
        proc.start()
    try:
        procs[1].wait_ready(lambda: http_ok(f"http://{LOOPBACK}:{port}/readyz"), 60)
        time.sleep(1.0)
        uvloop.run(drive(port, model, 10, 10, nonce=f"{nonce}-warm", seed=seed))
        return uvloop.run(drive(port, model, rate, int(rate * seconds), nonce=nonce, seed=seed))
    finally:
        for proc in procs:
            proc.stop(grace_s=10)


def summary(tree: str, answered: list[Answered], slowest: int) -> list[str]:
    latencies = sorted(a.latency_ms for a in answered)
    n = len(latencies)

    def at(q: float) -> float:
        return latencies[min(n - 1, int(q * n))]

    failed = sum(a.status != "SUCCESS" for a in answered)
    lines = [f"{tree}: {n} requests ({failed} not SUCCESS): p50 {at(0.5):.1f}, p99 "
             f"{at(0.99):.1f}, p99.9 {at(0.999):.1f}, max {latencies[-1]:.1f} ms"]
    for a in sorted(answered, key=lambda a: -a.latency_ms)[:slowest]:
        lines.append(f"  {a.latency_ms:6.1f} ms: client late {a.late_ms:5.1f}, to admission "
                     f"{a.to_admit_ms:5.1f}, queue and Triton {a.to_finish_ms:5.1f}, to the "
                     f"answer {a.to_answer_ms:5.1f} ({a.status})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default="services",
                        help="comma-separated services/ directories, run in turn each round")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--slowest", type=int, default=5, help="requests shown per run")
    parser.add_argument("--redis-masters", type=int, default=1,
                        help="one Redis (1), or a Redis Cluster of this many masters")
    args = parser.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    state = Path(tempfile.mkdtemp(prefix="ferry-tail-"))
    scenario = Scenario(FAST, 1)
    repository = write_repository(state / "models", [scenario], 50)
    triton, ports = start_triton(repository, state / "triton")
    redis_procs, redis_url, redis_env = start_redis_for(state, args.redis_masters)
    try:
        for round_ in range(args.rounds):
            for index, tree in enumerate(trees):
                answered = one_tree(
                    tree, state, redis_url=redis_url,
                    triton=(f"{LOOPBACK}:{ports.grpc}", f"{LOOPBACK}:{ports.http}"),
                    model=scenario.name, rate=args.rate, seconds=args.seconds,
                    nonce=f"tail-{round_}-{index}-{random.getrandbits(32):08x}",
                    seed=7 + round_, redis_env=redis_env)
                print("\n".join(summary(tree, answered, args.slowest)), flush=True)
    finally:
        for proc in redis_procs:
            proc.stop()
        triton.stop()


if __name__ == "__main__":
    main()
