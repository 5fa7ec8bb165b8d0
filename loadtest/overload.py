"""Overload: offer more than the backend can serve, every request with a deadline, and account for
every one of them.

Each request is one ``POST`` with ``X-Request-Timeout`` and ``Prefer: wait`` (longer than the
deadline); a 429 is a refusal (counted, with how fast it came from its send), anything accepted is
followed to its final status. At the end every accepted task is read back: one without a final
status is *lost*. The deadline's promise is checked on Ferry's own records, not on this client's
clock (which a loaded machine makes late): a SUCCESS written after its ``deadline_at`` is *late*,
and a held request answered without its final record (202) is *unheld*. Latency counts from each
request's scheduled send (open loop, Poisson arrivals). Beside the load, a *control* exchange (a
``GET`` of an unknown task: one Redis read, a 404) is sent 20 times a second, to show how late a
loaded machine makes any answer beside how fast the refusals came. Loopback only.

    .venv/bin/python -m loadtest.overload --url http://127.0.0.1:8000 --model sim \\
        --rate 240 --seconds 30 --timeout 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

from loadtest.flows import new_nonce, payload
from loadtest.generator import LOOPBACK_HOSTS, schedule
from loadtest.rawhttp import Pool

DRAIN_S = 30.0  # after the last send, what has not answered by then is counted as lost
CONTROL_RPS = 20.0  # the control exchange's rate


@dataclass
class OverloadResult:
    offered_rps: float
    seconds: float
    timeout_s: float
    sent: int = 0
    accepted: int = 0
    rejected: int = 0  # 429
    outcomes: dict[str, int] = field(default_factory=dict)  # final statuses of the accepted
    lost: int = 0  # accepted, and no final status at the end
    late: int = 0  # SUCCESS records written after their deadline_at (the deadline's promise)
    unheld: int = 0  # held requests answered 202, though their deadline came before the wait's end
    http_errors: dict[str, int] = field(default_factory=dict)  # anything but 200/202/429
    accepted_p50_s: float = 0.0
    accepted_p99_s: float = 0.0  # from scheduled send to final answer, SUCCESS and EXPIRED
    success_p99_s: float = 0.0
    rejected_p50_s: float = 0.0  # how fast a 429 came, from its send
    rejected_p99_s: float = 0.0
    control_p99_s: float = 0.0  # how fast the control exchange (a 404 from one Redis read) came
    success_rps: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class _Tally:
    """What one run heard, request by request."""

    pool: Pool
    errors: Counter[str] = field(default_factory=Counter)
    accepted: dict[str, float] = field(default_factory=dict)  # task id -> scheduled send
    finals: dict[str, tuple[str, float]] = field(default_factory=dict)
    refusals: list[float] = field(default_factory=list)
    controls: list[float] = field(default_factory=list)
    late: set[str] = field(default_factory=set)

    def ended(self, task_id: str, record: dict[str, Any], scheduled: float) -> None:
        self.finals[task_id] = (str(record["status"]), time.monotonic() - scheduled)
        if record["status"] == "SUCCESS" and record["finished_at"] > record["deadline_at"]:
            self.late.add(task_id)

    async def one(self, path: str, body: bytes, headers: list[tuple[str, str]],
                  scheduled: float) -> None:
        sent = time.monotonic()
        response = await self.pool.request("POST", path, body, "application/octet-stream",
                                           headers)
        if response.status == 429:
            self.refusals.append(time.monotonic() - sent)
            return
        if response.status not in (200, 202):
            self.errors[f"HTTP {response.status}"] += 1
            return
        answer = response.json()
        task_id = str(answer["task_id"])
        self.accepted[task_id] = scheduled
        if response.status == 200:
            self.ended(task_id, answer, scheduled)
            return
        self.errors["unheld"] += 1
        final = await self.pool.request("GET", f"/v1/result/{task_id}?wait=20")
        record = final.json() if final.status == 200 else {}
        if record.get("status", "PENDING") != "PENDING":
            self.ended(task_id, record, scheduled)

    async def control(self, until: float) -> None:
        """The control exchange, at CONTROL_RPS until ``until``: a GET of a task that does not
        exist, which no backlog can hold up."""
        while (now := time.monotonic()) < until:
            response = await self.pool.request("GET", f"/v1/result/control-{now:.6f}")
            if response.status != 404:
                self.errors[f"control HTTP {response.status}"] += 1
            self.controls.append(time.monotonic() - now)
            await asyncio.sleep(max(0.0, now + 1 / CONTROL_RPS - time.monotonic()))

    async def read_back(self) -> None:
        """What did not answer in time, read once more: without a final status, lost."""
        for task_id in set(self.accepted) - set(self.finals):
            record = (await self.pool.request("GET", f"/v1/result/{task_id}")).json()
            if record.get("status", "PENDING") != "PENDING":
                self.finals[task_id] = (str(record["status"]), float("inf"))


async def run(url: str, model: str, rate: float, seconds: float, timeout_s: float,
              *, seed: int = 7) -> OverloadResult:
    target = urlparse(url)
    if target.hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"load tests target loopback only, not {target.hostname!r}")
    tally = _Tally(Pool(target.hostname or "127.0.0.1", target.port or 80))
    times = schedule(rate, max(1, int(rate * seconds)), seed=seed)
    result = OverloadResult(rate, seconds, timeout_s, sent=len(times))
    headers = [("X-Request-Timeout", f"{timeout_s:g}"), ("Prefer", "wait=10")]
    path = f"/v1/inference?model={model}"
    nonce = new_nonce()
    start = time.monotonic()

    async def one(index: int, at: float) -> None:
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        await tally.one(path, payload(index, nonce=nonce), headers, start + at)

    tasks = [asyncio.create_task(one(i, at)) for i, at in enumerate(times)]
    tasks.append(asyncio.create_task(tally.control(start + times[-1])))
    await asyncio.wait(tasks, timeout=times[-1] + DRAIN_S)
    for task in tasks:
        task.cancel()
    await tally.read_back()
    await tally.pool.close()
    result.unheld = tally.errors.pop("unheld", 0)
    result.late = len(tally.late)
    result.http_errors = dict(tally.errors)
    result.control_p99_s = percentile(tally.controls, 0.99)
    return summarize(result, len(tally.accepted), tally.finals, tally.refusals)


def summarize(result: OverloadResult, accepted: int, finals: dict[str, tuple[str, float]],
              refusals: list[float]) -> OverloadResult:
    """Counts and percentiles from each accepted task's final (status, latency)."""
    latencies = [s for _, s in finals.values()]
    successes = [s for status, s in finals.values() if status == "SUCCESS"]
    result.accepted, result.rejected = accepted, len(refusals)
    result.outcomes = dict(Counter(status for status, _ in finals.values()))
    result.lost = accepted - len(finals)
    result.accepted_p50_s = percentile(latencies, 0.50)
    result.accepted_p99_s = percentile(latencies, 0.99)
    result.success_p99_s = percentile(successes, 0.99)
    result.rejected_p50_s = percentile(refusals, 0.50)
    result.rejected_p99_s = percentile(refusals, 0.99)
    result.success_rps = len(successes) / result.seconds
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="sim")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=2.0, help="each request's deadline, s")
    args = parser.parse_args()
    outcome = asyncio.run(run(args.url, args.model, args.rate, args.seconds, args.timeout))
    print(json.dumps(outcome.to_json(), indent=2))


if __name__ == "__main__":
    main()
