"""Load Ferry with Locust, for those who prefer it (``make bench`` uses ``loadtest.generator``).

    .venv/bin/locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 \\
        --headless --users 50 --spawn-rate 10 --run-time 30s

Each user sends one inference a second, a distinct 2 KB payload to ``FERRY_LOCUST_MODEL``
(default ``sim``), and checks that the answer is its own: three in four in one request
(``Prefer: wait``), one in four as ``POST`` then ``GET ?wait=``. Locust is closed-loop (a user
waits for its answer before the next request), so under overload it hides queueing that an
open-loop generator shows; use it to load Ferry, and ``make bench`` for latency figures.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

from locust import FastHttpUser, constant_throughput, task

from loadtest.flows import MAX_POLLS, POLL_WAIT_S, digest_matches, new_nonce, payload

MODEL = os.environ.get("FERRY_LOCUST_MODEL", "sim")
_counter = itertools.count()
NONCE = new_nonce()  # distinct payloads across runs: the result cache must not answer them


def _problem(body: dict[str, Any], data: bytes) -> str:
    """What is wrong with a final record, or "" when it is the right answer."""
    if body.get("status") != "SUCCESS":
        return f"{body.get('status')}: {body.get('error', '')}"
    output = body.get("output", {}).get("OUTPUT")
    return "" if digest_matches(output, data) else "the answer is not for this request"


class FerryUser(FastHttpUser):
    wait_time = constant_throughput(1)

    @task(3)
    def one_request(self) -> None:
        data = payload(next(_counter), nonce=NONCE)
        with self.client.post(f"/v1/inference?model={MODEL}", data=data.decode(),
                              headers={"Content-Type": "application/octet-stream",
                                       "Prefer": f"wait={POLL_WAIT_S}"},
                              name="POST /v1/inference (Prefer: wait)",
                              catch_response=True) as response:
            if response.status_code == 202:
                response.success()
                self._poll(json.loads(response.content)["status_url"], data)
            elif response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text}")
            elif problem := _problem(json.loads(response.content), data):
                response.failure(problem)

    @task(1)
    def post_then_get(self) -> None:
        data = payload(next(_counter), nonce=NONCE)
        with self.client.post(f"/v1/inference?model={MODEL}", data=data.decode(),
                              headers={"Content-Type": "application/octet-stream"},
                              name="POST /v1/inference", catch_response=True) as response:
            if response.status_code != 202:
                response.failure(f"HTTP {response.status_code}: {response.text}")
                return
        self._poll(json.loads(response.content)["status_url"], data)

    def _poll(self, status_url: str, data: bytes) -> None:
        for _ in range(MAX_POLLS):
            with self.client.get(f"{status_url}?wait={POLL_WAIT_S}",
                                 name="GET /v1/result/[id]?wait", catch_response=True) as poll:
                if poll.status_code != 200:
                    poll.failure(f"HTTP {poll.status_code}: {poll.text}")
                    return
                body = json.loads(poll.content)
                if body.get("status") != "PENDING":
                    if problem := _problem(body, data):
                        poll.failure(problem)
                    return
