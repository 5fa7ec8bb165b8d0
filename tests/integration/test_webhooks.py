"""Webhooks against a real receiver on loopback: signed, retried, never redirected, recorded on
the task; only allowed hosts."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import redis
from aiohttp import web

from ferry.stack.ports import free_port
from ferry.webhooks import verify
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Stack,
    batcher_settings,
    gateway_settings,
    running_gateway,
    running_stack,
    stream_lengths,
    task_keys,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
SECRET = "s3cret"


@dataclass
class Receiver:
    """A webhook endpoint: answers with ``replies`` in turn (then 200), records every call."""

    port: int
    replies: list[int] = field(default_factory=list)
    calls: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append((request.path, dict(request.headers), await request.read()))
        status = self.replies.pop(0) if self.replies else 200
        if status in (301, 302, 307):
            return web.Response(status=status, headers={"Location": self.url("/elsewhere")})
        return web.Response(status=status)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    got = Receiver(free_port())
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", got.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", got.port)
    await site.start()
    yield got
    await runner.cleanup()


def hooked(redis_url: str, url: str, **overrides: Any) -> tuple[Any, Any]:
    common = {"webhook_allowed_hosts": "127.0.0.1", "webhook_secret": SECRET}
    return (gateway_settings(redis_url, url, **common),
            batcher_settings(redis_url, url, **common, **overrides))


async def submit(client: httpx.AsyncClient, text: str, callback: str, *,
                 header: bool = False) -> httpx.Response:
    if header:
        return await client.post("/v1/inference?model=sim", content=text.encode(),
                                 headers={"Content-Type": "text/plain",
                                          "Ferry-Callback": callback})
    return await client.post("/v1/inference", content=orjson.dumps(
        {"model": "sim", "input": text, "callback_url": callback}),
        headers={"Content-Type": "application/json"})


async def recorded(stack: Stack, task_id: str) -> dict[str, Any]:
    """The task's record once its webhook's outcome is in it (at most 10 s)."""
    for _ in range(100):
        record = await stack.result(task_id)
        if "webhook" in record:
            return record
        await asyncio.sleep(0.1)
    raise AssertionError(f"no webhook outcome on {task_id}: {record}")


async def test_the_final_record_is_posted_signed_and_the_outcome_recorded(
    redis_url: str, triton_server: TritonServer, receiver: Receiver,
    redis_client: redis.Redis,
) -> None:
    gateway, batcher = hooked(redis_url, triton_server.grpc_url)
    async with running_stack(gateway, batcher) as stack:
        task_id = (await submit(stack.client, "notify me", receiver.url())).json()["task_id"]
        other = (await submit(stack.client, "by header", receiver.url("/h"), header=True)
                 ).json()["task_id"]
        assert await wait_until(lambda: len(receiver.calls) == 2, 10)
        record = await recorded(stack, task_id)
        await recorded(stack, other)  # its entry is deleted once the 200 is back
    by_path = {path: (headers, body) for path, headers, body in receiver.calls}
    headers, body = by_path["/hook"]
    sent = orjson.loads(body)
    assert sent["task_id"] == task_id and sent["status"] == "SUCCESS" and "output" in sent
    assert headers["Ferry-Task"] == task_id
    assert verify(SECRET, headers["Ferry-Signature"], body, time.time())
    assert not verify("wrong", headers["Ferry-Signature"], body, time.time())
    assert not verify(SECRET, headers["Ferry-Signature"], body, time.time() + 3600)  # replayed
    assert orjson.loads(by_path["/h"][1])["task_id"] == other
    assert record["webhook"]["status"] == "delivered"
    assert record["webhook"]["attempts"] == 1 and record["webhook"]["http_status"] == 200
    assert sum(int(redis_client.xlen(f"ferry:{{p{p}}}:webhooks")) for p in range(16)) == 0


async def test_a_failing_receiver_is_retried_and_a_redirect_is_never_followed(
    redis_url: str, triton_server: TritonServer, receiver: Receiver,
) -> None:
    gateway, batcher = hooked(redis_url, triton_server.grpc_url, webhook_retry_s=2.0)
    receiver.replies = [500, 503]  # then 200
    async with running_stack(gateway, batcher) as stack:
        retried = (await submit(stack.client, "flaky", receiver.url())).json()["task_id"]
        assert await wait_until(lambda: len(receiver.calls) == 3, 10)
        receiver.replies = [302] * 20
        moved = (await submit(stack.client, "moved", receiver.url("/moved"))).json()["task_id"]
        record = await recorded(stack, moved)
        first = await recorded(stack, retried)
    assert first["webhook"]["status"] == "delivered" and first["webhook"]["attempts"] == 3
    assert record["webhook"]["status"] == "failed"
    assert record["webhook"]["error"] == "HTTP 302"
    assert record["webhook"]["attempts"] >= 2
    assert all(path != "/elsewhere" for path, _, _ in receiver.calls)  # never followed


async def test_only_allowed_hosts_and_nothing_enqueued_otherwise(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_gateway(gateway_settings(redis_url, url)) as client:
        off = await submit(client, "x", "http://127.0.0.1:9/hook")
    assert off.status_code == 400 and off.json()["error"]["code"] == "webhooks_disabled"
    gateway, _ = hooked(redis_url, url)
    async with running_gateway(gateway) as client:
        for target, code in (("http://169.254.169.254/latest", "callback_not_allowed"),
                             ("http://localhost:80/x", "callback_not_allowed"),
                             ("ftp://127.0.0.1/x", "invalid_callback"),
                             ("http://user:pw@127.0.0.1/x", "invalid_callback"),
                             ("http://127.0.0.1:99999/x", "invalid_callback")):
            answer = await submit(client, "x", target)
            assert answer.status_code == 400, target
            assert answer.json()["error"]["code"] == code, target
    assert stream_lengths(redis_client) == 0 and task_keys(redis_client) == []


async def test_a_cache_hit_gets_the_answer_not_the_first_tasks_webhook(
    redis_url: str, triton_server: TritonServer, receiver: Receiver,
) -> None:
    gateway, batcher = hooked(redis_url, triton_server.grpc_url)
    async with running_stack(gateway, batcher) as stack:
        first = (await submit(stack.client, "shared answer", receiver.url())).json()["task_id"]
        assert (await recorded(stack, first))["webhook"]["status"] == "delivered"
        hit = (await stack.client.post("/v1/inference?model=sim", content=b"shared answer",
                                       headers={"Content-Type": "text/plain",
                                                "Prefer": "wait=5"})).json()
        hooked_hit = (await submit(stack.client, "shared answer", receiver.url("/2"))
                      ).json()["task_id"]
        own = await recorded(stack, hooked_hit)
    assert hit["cache"] == "hit" and "webhook" not in hit and "output" in hit
    assert own["cache"] == "hit" and own["webhook"]["status"] == "delivered"
    assert [path for path, _, _ in receiver.calls] == ["/hook", "/2"]


@pytest.mark.parametrize("allow_private", [False, True])
async def test_an_allowed_name_that_resolves_to_a_private_address_is_not_called(
    redis_url: str, triton_server: TritonServer, receiver: Receiver, allow_private: bool,
) -> None:
    url = triton_server.grpc_url
    common = {"webhook_allowed_hosts": "localhost", "webhook_secret": SECRET}
    async with running_stack(gateway_settings(redis_url, url, **common),
                             batcher_settings(redis_url, url, webhook_allow_private=allow_private,
                                              **common)) as stack:
        callback = f"http://localhost:{receiver.port}/named"
        task_id = (await submit(stack.client, "by name", callback)).json()["task_id"]
        record = await recorded(stack, task_id)
    if allow_private:
        assert record["webhook"]["status"] == "delivered"
        assert [(path, headers["Host"]) for path, headers, _ in receiver.calls] == [
            ("/named", f"localhost:{receiver.port}")]  # the name kept, the address pinned
    else:
        assert record["webhook"]["status"] == "failed" and record["webhook"]["attempts"] == 0
        assert "non-public address" in record["webhook"]["error"]
        assert receiver.calls == []


async def test_a_jobs_every_state_change_is_posted_signed_with_its_record(
        redis_url: str, triton_server: TritonServer, receiver: Receiver, tmp_path: Any) -> None:
    gateway, batcher = hooked(redis_url, triton_server.grpc_url)
    gateway = dataclasses.replace(gateway, job_store_dir=str(tmp_path / "jobs"))
    async with running_stack(gateway, batcher) as stack:
        lines = b"".join(orjson.dumps({"custom_id": f"i{i}", "input": f"x{i}"}) + b"\n"
                         for i in range(20))
        submitted = await stack.client.post(
            "/v1/jobs", content=lines, headers={"Content-Type": "application/x-ndjson"},
            params={"model": "sim", "callback_url": receiver.url("/jobs")})
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        assert await wait_until(lambda: any(
            orjson.loads(body)["status"] == "completed" for _, _, body in receiver.calls), 30)
    states = [orjson.loads(body)["status"] for _, _, body in receiver.calls]
    assert states == ["queued", "running", "finalizing", "completed"]
    for path, headers, body in receiver.calls:
        assert path == "/jobs" and headers["Ferry-Job"] == job_id
        assert verify(SECRET, headers["Ferry-Signature"], body, time.time())
    assert orjson.loads(receiver.calls[-1][2])["request_counts"]["succeeded"] == 20
