"""Which of Ferry's modules one request runs through: a POST with ``Prefer: wait`` to a gateway
and a batcher in one process (the tests' ``running_stack``, real Redis and Triton), after three
warm-up requests, with every Python call recorded by ``sys.setprofile`` and attributed to the
asyncio task that made it (the request's own task is the gateway's side; the batcher's loops and
batches are named ``ferry-*``). Run through pytest, for the tests' fixtures:

    .venv/bin/python -m pytest -q -s -p tests.conftest loadtest/path_modules.py

It prints the modules of each side and how many there are (docs/architecture.md, "One request's
path"). A measurement, not a test: it asserts only that the request succeeded.
"""

from __future__ import annotations

import asyncio
import sys
from collections import defaultdict
from types import FrameType
from typing import Any

from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, gateway_settings, running_stack

HEADERS = {"Content-Type": "text/plain", "Prefer": "wait=10"}


def side_of(task: asyncio.Task[Any] | None, request: asyncio.Task[Any] | None) -> str:
    if task is None:
        return "callbacks"
    return "gateway" if task is request else "batcher"


async def test_one_requests_path(redis_url: str, triton_server: TritonServer) -> None:
    url = triton_server.grpc_url
    seen: dict[str, set[str]] = defaultdict(set)
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        for i in range(3):  # the catalog, the capacity and the scripts loaded
            warm = await stack.client.post("/v1/inference?model=sim", content=b"warm%d" % i,
                                           headers=HEADERS)
            assert warm.status_code == 200
        request = asyncio.current_task()  # the ASGI transport serves in the caller's task

        def profile(frame: FrameType, event: str, _: Any) -> None:
            module = frame.f_globals.get("__name__", "")
            if event == "call" and module.startswith("ferry."):
                try:
                    task = asyncio.current_task()
                except RuntimeError:
                    task = None
                seen[side_of(task, request)].add(module)

        sys.setprofile(profile)
        try:
            answer = await stack.client.post("/v1/inference?model=sim", content=b"counted",
                                             headers=HEADERS)
        finally:
            sys.setprofile(None)
        assert answer.status_code == 200
    every = set().union(*seen.values())
    print(f"\n{len(every)} modules in all")
    for side, modules in sorted(seen.items()):
        print(f"{side}: {len(modules)}: {' '.join(sorted(modules))}")
