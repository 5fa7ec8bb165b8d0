"""How many accepted tasks a Redis failover loses, with and without replica acknowledgement.

Runs a Sentinel group (1 master, 2 replicas, 3 sentinels), one Triton serving the sim model, and
a gateway and a batcher in this process; drives open-loop load of distinct inputs (each with an
Idempotency-Key, retried on 503/429 and broken connections) and ``kill -9``s the master
``--kills`` times, each time once the last failover is over and the old master has rejoined as a
replica. Then it asks for every task that was answered 202: lost = no record or never final;
wrong = an answer that is not its input's. Each ``--min-replicas`` value runs on the same servers.

    .venv/bin/python -m loadtest.failover --min-replicas 0,1 --runs 3 --rate 200

The integration tests (tests/integration/test_redis_ha.py) use the same load and ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ferry.batcher.worker import Batcher
from ferry.gateway.app import create_app
from ferry.settings import BatcherSettings, GatewaySettings
from ferry.stack.ports import LOOPBACK, free_ports
from ferry.stack.redis_ha import SentinelGroup, start_sentinel_group
from ferry.stack.triton_server import start_triton
from ferry.stack.up import bundled_repository

Fault = tuple[float, Callable[[], Awaitable[None]]]  # seconds into the load, what happens then


@dataclass
class Ledger:
    """What the load saw: every accepted task with its input, and the refusals retried."""

    accepted: dict[str, bytes] = field(default_factory=dict)
    retried: dict[str, int] = field(default_factory=dict)
    given_up: int = 0


async def submit(client: httpx.AsyncClient, payload: bytes, ledger: Ledger) -> None:
    """POST one input until it is accepted (with one Idempotency-Key: retries are safe)."""
    headers = {"Content-Type": "application/octet-stream", "Idempotency-Key": uuid.uuid4().hex}
    for attempt in range(60):
        try:
            response = await client.post("/v1/inference?model=sim", content=payload,
                                         headers=headers)
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        else:
            if response.status_code == 202:
                ledger.accepted[str(response.json()["task_id"])] = payload
                return
            if response.status_code not in (429, 503):  # never a 500: a bug, said loudly
                raise AssertionError(f"{response.status_code}: {response.text}")
            code = str(response.json()["error"]["code"])
        ledger.retried[code] = ledger.retried.get(code, 0) + 1
        await asyncio.sleep(min(0.05 * 2 ** attempt, 0.5))
    ledger.given_up += 1


async def drive(client: httpx.AsyncClient, *, seconds: float, rate: float,
                faults: list[Fault]) -> Ledger:
    """Open-loop load of distinct inputs at ``rate`` per second, with ``faults`` on time."""
    ledger, sent = Ledger(), []
    start = time.monotonic()
    for at, fault in faults:
        sent.append(asyncio.ensure_future(_at(start + at, fault)))
    for index in range(int(seconds * rate)):
        await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
        payload = f"ha-{index}-{uuid.uuid4().hex}".encode()
        sent.append(asyncio.ensure_future(submit(client, payload, ledger)))
    await asyncio.gather(*sent)
    return ledger


async def _at(when: float, fault: Callable[[], Awaitable[None]]) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))
    await fault()


def answer(body: dict[str, Any]) -> str:
    """The sim model's answer: the SHA-256 of the input it was given."""
    output = body.get("output")
    found = output.get("OUTPUT") if isinstance(output, dict) else None
    return str(found.get("sha256")) if isinstance(found, dict) else ""


async def lost_and_wrong(client: httpx.AsyncClient, ledger: Ledger
                         ) -> tuple[list[str], list[str]]:
    """The accepted tasks that no longer exist or never ended, and those answered wrongly."""
    lost: list[str] = []
    wrong: list[str] = []
    asking = asyncio.Semaphore(64)  # as clients would: not thousands of polls at once

    async def check(task_id: str, payload: bytes) -> None:
        async with asking:
            await check_one(task_id, payload)

    async def check_one(task_id: str, payload: bytes) -> None:
        body: dict[str, Any] = {}
        status = 0
        for _ in range(6):  # long polls, 10 s each at most
            response = await client.get(f"/v1/result/{task_id}", params={"wait": 10})
            status = response.status_code
            body = response.json() if status == 200 else {"status": response.text[:300]}
            if status != 200 or body.get("status") != "PENDING":
                break
        if body.get("status") != "SUCCESS":
            lost.append(f"{task_id}: {body.get('status') or status}")
        elif answer(body) != hashlib.sha256(payload).hexdigest():
            wrong.append(task_id)

    await asyncio.gather(*(check(t, p) for t, p in ledger.accepted.items()))
    return lost, wrong


def kill_master(group: SentinelGroup, log: list[str]) -> Callable[[], Awaitable[None]]:
    """``kill -9`` of the master; once the sentinels have promoted a replica, the old master
    starts again and rejoins as a replica."""
    async def fault() -> None:
        old = group.master()
        old.kill(signal.SIGKILL)
        started = time.monotonic()
        new = await asyncio.to_thread(group.wait_failover, old.port)
        log.append(f"master {old.port} killed; {new} promoted in "
                   f"{time.monotonic() - started:.1f} s")
        await asyncio.to_thread(group.restart, old)
        await asyncio.to_thread(group.wait_replica, old)
    return fault


@contextlib.asynccontextmanager
async def in_process(gateway: GatewaySettings, batcher: BatcherSettings
                     ) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway (called in process, no sockets) and a batcher, in this event loop."""
    app = create_app(gateway)
    worker = Batcher.from_settings(batcher)
    async with app.fallback.router.lifespan_context(app.fallback):
        await worker.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://ferry.test", timeout=60) as client:
                yield client
        finally:
            await worker.stop()


@dataclass
class Run:
    min_replicas: int
    accepted: int
    lost: int
    wrong: int
    retried: dict[str, int]
    failovers: list[str]
    examples: list[str]  # a few of the lost, with what their result said


async def one_run(group: SentinelGroup, triton: str, min_replicas: int,
                  args: argparse.Namespace) -> Run:
    common: dict[str, Any] = {
        "redis_url": "redis://127.0.0.1:6379/0", "redis_sentinels": group.sentinel_spec,
        "redis_sentinel_master": group.name, "triton_url": triton,
        "redis_socket_timeout_s": 3.0, "redis_min_replicas": min_replicas}
    port, grpc_port = free_ports(2)
    gateway = GatewaySettings(**common, default_model="sim", port=port, grpc_port=grpc_port)
    batcher = BatcherSettings(**common, metrics_port=0, read_block_ms=500, claim_idle_ms=3000)
    log: list[str] = []
    faults: list[Fault] = [(2.0 + i * args.every, kill_master(group, log))
                           for i in range(args.kills)]
    async with in_process(gateway, batcher) as client:
        ledger = await drive(client, seconds=2.0 + args.kills * args.every, rate=args.rate,
                             faults=faults)
        lost, wrong = await lost_and_wrong(client, ledger)
    return Run(min_replicas, len(ledger.accepted), len(lost), len(wrong), ledger.retried, log,
               lost[:5])


async def main_async(args: argparse.Namespace) -> list[Run]:
    state = Path(tempfile.mkdtemp(prefix="ferry-failover-"))
    group = start_sentinel_group(state / "redis")
    triton, ports = start_triton(bundled_repository(), state / "triton")
    runs: list[Run] = []
    try:
        for index in range(args.runs):
            for setting in args.min_replicas:
                run = await one_run(group, f"{LOOPBACK}:{ports.grpc}", setting, args)
                runs.append(run)
                print(f"run {index + 1}, FERRY_REDIS_MIN_REPLICAS={setting}: {run.accepted} "
                      f"accepted, {run.lost} lost, {run.wrong} wrong; retried {run.retried}; "
                      f"{'; '.join(run.failovers)}; lost e.g. {run.examples}", flush=True)
    finally:
        triton.stop()
        group.stop()
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.failover",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-replicas", default="0,1", type=lambda s: [int(v) for v in
                                                                          s.split(",")])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--kills", type=int, default=2, help="master kills per run")
    parser.add_argument("--every", type=float, default=8.0, help="seconds between kills")
    parser.add_argument("--out", help="write the runs as JSON here")
    args = parser.parse_args()
    runs = asyncio.run(main_async(args))
    for setting in args.min_replicas:
        mine = [r for r in runs if r.min_replicas == setting]
        print(f"FERRY_REDIS_MIN_REPLICAS={setting}: {sum(r.lost for r in mine)} lost of "
              f"{sum(r.accepted for r in mine)} accepted over {len(mine)} runs "
              f"({sum(len(r.failovers) for r in mine)} failovers); "
              f"{sum(r.wrong for r in mine)} wrong")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 1 if any(r.lost or r.wrong for r in runs if r.min_replicas > 0) else 0


if __name__ == "__main__":
    raise SystemExit(main())
