"""Open-loop load against a running Ferry gateway (loopback only, bounded in count and time).

Requests are sent on a fixed schedule (constant rate), whatever the server does, and each one's
latency counts from its *scheduled* send time, so a slow server cannot hide queueing (no
coordinated omission). Each request then long-polls its own result.

    .venv/bin/python -m loadtest.open_loop --url http://127.0.0.1:8000 --rate 200 --count 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from loadtest.rawhttp import Pool

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


@dataclass
class Outcome:
    status: str
    latency_s: float


async def one(pool: Pool, scheduled: float, model: str, index: int) -> Outcome:
    try:
        body = json.dumps({"model": model, "input": f"load-{index}"}).encode()
        accepted = await pool.request("POST", "/v1/inference", body)
        if accepted.status != 202:
            return Outcome(f"HTTP {accepted.status}", time.perf_counter() - scheduled)
        url = accepted.json()["status_url"]
        for _ in range(10):  # 10 long-polls of up to 30 s: bounded
            result = (await pool.request("GET", f"{url}?wait=30")).json()
            if result["status"] != "PENDING":
                return Outcome(result["status"], time.perf_counter() - scheduled)
        return Outcome("PENDING", time.perf_counter() - scheduled)
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        return Outcome(type(exc).__name__, time.perf_counter() - scheduled)


async def run(url: str, rate: float, count: int, model: str) -> dict[str, object]:
    parsed = urlparse(url)
    pool = Pool(parsed.hostname or "127.0.0.1", parsed.port or 80)
    try:
        start = time.perf_counter() + 0.1
        tasks = []
        for i in range(count):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(pool, scheduled, model, i)))
        outcomes = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    finally:
        await pool.close()
    latencies = sorted(o.latency_s * 1000 for o in outcomes if o.status == "SUCCESS")
    statuses: dict[str, int] = {}
    for o in outcomes:
        statuses[o.status] = statuses.get(o.status, 0) + 1
    q = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    return {"offered_rps": rate, "count": count, "elapsed_s": round(elapsed, 2),
            "achieved_rps": round(count / elapsed, 1), "statuses": statuses,
            "p50_ms": round(q[49], 1), "p90_ms": round(q[89], 1), "p99_ms": round(q[98], 1),
            "max_ms": round(latencies[-1], 1) if latencies else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--count", type=int, default=2000, help="requests in all (max 100000)")
    parser.add_argument("--model", default="sim")
    args = parser.parse_args()
    if urlparse(args.url).hostname not in LOOPBACK_HOSTS:
        parser.error("load goes to loopback addresses only")
    if not 0 < args.count <= 100_000 or args.rate <= 0:
        parser.error("count must be 1..100000 and rate positive")
    print(json.dumps(asyncio.run(run(args.url, args.rate, args.count, args.model))))


if __name__ == "__main__":
    main()
