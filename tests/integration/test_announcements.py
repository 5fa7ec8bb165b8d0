"""A task's end is announced to the gateway process that admitted it (its id's tag); a wait at
another process (a GET that lands elsewhere, a held call retried elsewhere) listens on that
process's channel too. Two gateway processes and a batcher, each ``python -m ferry``, against a
real Redis and Triton."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ferry import keys
from ferry.settings import GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, http_ok
from ferry.stack.process import ManagedProcess, env_with
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, ferry_processes, gateway_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
TASKS = 12
RAW = {"Content-Type": "application/octet-stream"}


@contextmanager
def another_gateway(settings: GatewaySettings, logs: Path) -> Iterator[str]:
    proc = ManagedProcess("gateway-b", [sys.executable, "-m", "ferry", "gateway"],
                          env=env_with(to_env(settings, GatewaySettings)),
                          log_path=logs / "gateway-b.log")
    url = f"http://{LOOPBACK}:{settings.port}"
    try:
        proc.start()
        proc.wait_ready(lambda: http_ok(f"{url}/readyz"), 60)
        yield url
    finally:
        proc.stop(grace_s=10)


def test_a_task_is_awaited_at_any_gateway_process(
    redis_url: str, triton_server: TritonServer, tmp_path: Path,
) -> None:
    """Admitted at one process and long-polled at the other, both ways, and held at one with
    ``Prefer: wait``: every wait ends SUCCESS with its own answer (one that missed its task's
    announcement would answer PENDING when its wait ran out)."""
    first = gateway_settings(redis_url, triton_server.grpc_url, workers=1)
    second = gateway_settings(redis_url, triton_server.grpc_url, workers=1)
    batcher = batcher_settings(redis_url, triton_server.grpc_url)
    tags = set()
    with ferry_processes(first, batcher, tmp_path) as a, \
            another_gateway(second, tmp_path) as b, httpx.Client(timeout=60) as client:
        for n in range(TASKS):
            admit, poll = (a, b) if n % 2 == 0 else (b, a)
            posted = client.post(f"{admit}/v1/inference", params={"model": "sim"},
                                 content=f"input {n}".encode(), headers=RAW)
            assert posted.status_code == 202, posted.text
            task_id = posted.json()["task_id"]
            tags.add((admit, keys.announce_tag(task_id)))
            got = client.get(f"{poll}/v1/result/{task_id}", params={"wait": 30})
            assert got.status_code == 200 and got.json()["status"] == "SUCCESS", got.text
            held = client.post(f"{poll}/v1/inference", params={"model": "sim"},
                               content=f"held {n}".encode(),
                               headers={**RAW, "Prefer": "wait=30"})
            assert held.status_code == 200 and held.json()["status"] == "SUCCESS", held.text
            assert held.json()["output"] != got.json()["output"]
    assert len({tag for _, tag in tags}) == 2  # each process its own tag, its tasks all carry it
    assert len(tags) == 2
