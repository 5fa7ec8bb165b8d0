"""The soak's client of the gateways: submissions retried with their Idempotency-Key, and
long-polls that follow a task to its final record, both bounded in count and in time. With
``prefer_wait_s`` each submission holds for its answer (``Prefer: wait``), as the bench's
recovery part sends them."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from typing import Any

from loadtest.rawhttp import Pool, Response
from loadtest.soak.clock import Clock
from loadtest.soak.ledger import Attempt, Tracked, is_final
from loadtest.soak.plan import backoff_s

MODEL = "sim"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_SUBMIT_ATTEMPTS = 12
SUBMIT_TIMEOUT_S = 10.0  # a POST unanswered this long is tried again (a stopped gateway
# answers after its pause: a shorter wait only adds retries to an overloaded stack)
POLL_WAIT_S = 10
POLL_SLACK_S = 5.0  # a long-poll unanswered ``wait`` + this long is tried again elsewhere
NOT_FOUND_PAUSE_S = 1.0
FAILURES = (OSError, TimeoutError, ConnectionError, ValueError)


def error_code(response: Response) -> str:
    """``<status> <code>`` of an error answer (``503 not_replicated``)."""
    try:
        body = response.json()
        code = body.get("error", {}).get("code", "") if isinstance(body, dict) else ""
    except ValueError:
        code = ""
    return f"{response.status} {code}".strip()


class Gateways:
    """Keep-alive connections to every gateway; requests with a deadline."""

    def __init__(self, ports: list[int], host: str = "127.0.0.1") -> None:
        self.pools = [Pool(host, port) for port in ports]

    def __len__(self) -> int:
        return len(self.pools)

    async def request(self, gateway: int, method: str, path: str, *, timeout_s: float,
                      body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()
                      ) -> Response:
        return await asyncio.wait_for(
            self.pools[gateway].request(method, path, body, "application/octet-stream",
                                        headers), timeout_s)

    async def close(self) -> None:
        for pool in self.pools:
            await pool.close()


class Client:
    def __init__(self, gateways: Gateways, clock: Clock, seed: int, *,
                 prefer_wait_s: int = 0, model: str = MODEL) -> None:
        self.gateways = gateways
        self.clock = clock
        self.prefer_wait_s = prefer_wait_s  # > 0: a POST holds this long for its answer
        self.model = model
        self.rng = random.Random(seed)
        self.retries: Counter[str] = Counter()  # cause of each retried POST
        self.refused: Counter[str] = Counter()  # submissions given up, by their last cause

    async def submit(self, task: Tracked, deadline_s: float) -> None:
        """POST until a 202 (then ``task.task_id`` is set) or a 200 with the final record (then
        ``task.first_final`` too), a refusal that a retry cannot change, MAX_SUBMIT_ATTEMPTS, or
        ``deadline_s``; each try goes to the next gateway."""
        outcome = ""
        for attempt in range(MAX_SUBMIT_ATTEMPTS):
            gateway = (task.index + attempt) % len(self.gateways)
            outcome, record = await self._post(gateway, task)
            task.attempts.append(Attempt(round(self.clock.now(), 3), gateway, outcome))
            if record is not None:
                task.task_id, task.accepted_s = str(record["task_id"]), self.clock.now()
                if is_final(record):
                    task.first_final, task.final_seen_s = record, task.accepted_s
                return
            if not retryable(outcome) or self.clock.now() >= deadline_s:
                break
            self.retries[outcome] += 1
            await asyncio.sleep(backoff_s(attempt + 1) * self.rng.uniform(0.5, 1.0))
        self.refused[outcome] += 1

    async def _post(self, gateway: int, task: Tracked) -> tuple[str, dict[str, Any] | None]:
        """One POST's outcome, and the record it answered (202: its id; 200: final)."""
        headers: tuple[tuple[str, str], ...] = (("Idempotency-Key", task.key),)
        timeout_s = SUBMIT_TIMEOUT_S
        if self.prefer_wait_s:
            headers += (("Prefer", f"wait={self.prefer_wait_s}"),)
            timeout_s = self.prefer_wait_s + POLL_SLACK_S
        try:
            response = await self.gateways.request(
                gateway, "POST", f"/v1/inference?model={self.model}", timeout_s=timeout_s,
                body=task.data, headers=headers)
        except FAILURES as exc:
            return type(exc).__name__, None
        if response.status in (200, 202):
            record: dict[str, Any] = response.json()
            return str(response.status), record
        return error_code(response), None

    async def follow(self, task: Tracked, deadline_s: float) -> None:
        """Long-poll the task's record until it is final or ``deadline_s`` passes; a gateway
        that does not answer is left for the next one."""
        assert task.task_id is not None
        gateway = task.attempts[-1].gateway
        while (remaining := deadline_s - self.clock.now()) > 0:
            wait = max(1, min(POLL_WAIT_S, int(remaining)))
            record, seen = await self._get(gateway, task.task_id, wait)
            if is_final(record):
                task.first_final, task.final_seen_s = record, self.clock.now()
                return
            task.last_seen = seen
            if record is None:  # not found, or the gateway failed: try the other one
                gateway = (gateway + 1) % len(self.gateways)
                await asyncio.sleep(NOT_FOUND_PAUSE_S if seen == "404" else 0.2)

    async def read(self, task_id: str, gateway: int = 0, wait: int = 0
                   ) -> tuple[dict[str, Any] | None, str]:
        """The task's record (None if there is none), and what the read saw."""
        return await self._get(gateway, task_id, wait)

    async def _get(self, gateway: int, task_id: str, wait: int
                   ) -> tuple[dict[str, Any] | None, str]:
        path = f"/v1/result/{task_id}" + (f"?wait={wait}" if wait else "")
        try:
            response = await self.gateways.request(gateway, "GET", path,
                                                  timeout_s=wait + POLL_SLACK_S)
        except FAILURES as exc:
            return None, type(exc).__name__
        if response.status != 200:
            return None, str(response.status)
        try:
            record: dict[str, Any] = response.json()
        except json.JSONDecodeError:
            return None, "bad json"
        return record, str(record.get("status"))


def retryable(outcome: str) -> bool:
    """A refusal worth a retry: overload (429), unavailability (503...), or no answer."""
    head = outcome.split(" ", 1)[0]
    return not head.isdigit() or int(head) in RETRY_STATUSES
