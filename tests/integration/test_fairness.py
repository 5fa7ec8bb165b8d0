"""Fair share between clients (issue 34) on the slow backend (``sim_overload``: 50 + 2·B ms,
batches of 8, 121 tasks/s): weights give their share of a contended model, a client alone gets
every batch full, a light client is not kept behind a flood's backlog, and a task waiting in
fair order can be cancelled."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from ferry import keys
from ferry.auth.api_keys import key_hash
from ferry.priority import Priority
from tests.conftest import TritonServer
from tests.integration.helpers import (
    backlog_counts,
    batch_executions,
    batcher_settings,
    executions_since,
    flow_counts,
    gateway_settings,
    running_batchers,
    running_gateway,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
MODEL = "sim_overload"


async def submit(client: httpx.AsyncClient, who: str, text: str,
                 timeout_s: float | None = None) -> str:
    body: dict[str, Any] = {"model": MODEL, "input": text, "client_id": who}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    answer = await client.post("/v1/inference", json=body)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["task_id"])


async def flood(client: httpx.AsyncClient, who: str, text: str) -> str | None:
    """A flood's task: its id, or None when the backlog is full (a flood is refused, 429)."""
    answer = await client.post("/v1/inference", json={"model": MODEL, "input": text,
                                                      "client_id": who})
    if answer.status_code == 429:
        assert answer.json()["error"]["code"] == "backlog_full", answer.text
        return None
    assert answer.status_code == 202, answer.text
    return str(answer.json()["task_id"])


async def final(client: httpx.AsyncClient, task_id: str,
                ended: tuple[str, ...] = ("SUCCESS",)) -> dict[str, Any]:
    record: dict[str, Any] = (await client.get(f"/v1/result/{task_id}",
                                               params={"wait": 30})).json()
    assert record["status"] in ended, record
    return record


def right(record: dict[str, Any], text: str) -> bool:
    return bool(record["output"]["OUTPUT"] == {
        "length": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()})


def fair_queues(store: redis.Redis) -> int:
    return sum(int(store.exists(keys.fair_queue(p, priority)))
               for p in range(16) for priority in Priority)


async def test_weights_one_to_three_share_a_contended_model_one_to_three(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    """Both clients' tasks wait before the batcher starts, spread over the 16 partitions, light
    and heavy taking turns to send; while both wait, the rows sent go 1:3, within 10%."""
    url = triton_server.grpc_url
    gateway = gateway_settings(redis_url, url, fair_share_after=1,
                               client_weights="heavy=3")
    texts = {"light": [f"light-{i}" for i in range(160)],
             "heavy": [f"heavy-{i}" for i in range(480)]}
    async with running_gateway(gateway) as client:
        ids: dict[str, list[str]] = {"light": [], "heavy": []}
        for i in range(480):  # interleaved: first come, first served would give 1:3 only
            for who in ("light", "heavy"):  # after light's last
                if i < len(texts[who]):
                    ids[who].append(await submit(client, who, texts[who][i]))
        assert fair_queues(redis_client) > 0  # they wait in fair order
        async with running_batchers(batcher_settings(redis_url, url)):
            records = {who: await asyncio.gather(*(final(client, t) for t in ids[who]))
                       for who in ids}
    for who, found in records.items():
        assert all(right(r, t) for r, t in zip(found, texts[who], strict=True))
    ended = sorted((r["finished_at"], who) for who, found in records.items() for r in found)
    # The first 16 may have gone first come, first served (one a partition); then 192 more,
    # while both still wait in every partition (light has about 10 in each, heavy 30).
    window = [who for _, who in ended[16:208]]
    heavy = window.count("heavy") / len(window)
    assert 0.675 <= heavy <= 0.825, f"heavy's share {heavy:.2f}, not 0.75 within 10%"
    assert fair_queues(redis_client) == 0 and backlog_counts(redis_client) == 0
    assert flow_counts(redis_client) == 0  # every flow's count left with its tasks


async def test_a_client_alone_gets_every_batch_full(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    url = triton_server.grpc_url
    before = batch_executions(url, MODEL)
    async with running_gateway(gateway_settings(redis_url, url, fair_share_after=1)) as client:
        texts = [f"alone-{i}" for i in range(160)]
        ids = [await submit(client, "alone", t) for t in texts]
        async with running_batchers(batcher_settings(redis_url, url)):
            records = await asyncio.gather(*(final(client, t) for t in ids))
    assert all(right(r, t) for r, t in zip(records, texts, strict=True))
    ran = executions_since(before, batch_executions(url, MODEL))
    assert sum(size * count for size, count in ran.items()) == 160
    assert sum(ran.values()) <= 160 // 8 + 2, ran  # full batches of 8: the whole backend


async def light_latencies(redis_url: str, triton_url: str, fair_after: int,
                          timeout_s: float | None = None) -> list[float]:
    """A flood of 720 tasks (six seconds of the backend's work) lands at once (what the
    backlog limit refuses of it, refused); from 1.5 s on, when what the flood had queued first
    come, first served while alone (twice fair_after a partition) is done, a light client sends
    a task every 0.25 s, 8 in all, each with ``timeout_s`` as its deadline, every one of them
    admitted: how long each of those took (infinite if its deadline passed first)."""
    gateway = gateway_settings(redis_url, triton_url, fair_share_after=fair_after)

    async def light(client: httpx.AsyncClient, i: int) -> float:
        await asyncio.sleep(1.5 + 0.25 * i)  # pacing: the light client's arrivals
        started, text = time.monotonic(), f"light-{fair_after}-{i}"
        task_id = await submit(client, "light", text, timeout_s)
        record = await final(client, task_id, ("SUCCESS", "EXPIRED"))
        if record["status"] == "EXPIRED":
            return float("inf")
        assert right(record, text)
        return time.monotonic() - started

    async with running_gateway(gateway) as client, \
            running_batchers(batcher_settings(redis_url, triton_url)):
        flooded = await asyncio.gather(*(flood(client, "flood", f"flood-{fair_after}-{i}")
                                         for i in range(720)))
        took = await asyncio.gather(*(light(client, i) for i in range(8)))
        await asyncio.gather(*(final(client, t) for t in flooded if t is not None))
    return list(took)


async def test_a_light_client_is_not_kept_behind_a_flood(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    """First come, first served, the light client waits behind the flood's backlog (the
    control: this test can fail); with fair share it waits for about a batch or two, and a
    deadline of 1 s is admitted: the prediction counts what a fair share puts ahead of it (the
    flood's backlog, ahead of it first come first served, would be refused
    deadline_unmeetable)."""
    url = triton_server.grpc_url
    fifo = await light_latencies(redis_url, url, 0)
    fair = await light_latencies(redis_url, url, 4, timeout_s=1.0)
    assert min(fifo) > 1.0, fifo  # the control: behind seconds of the flood's work
    assert sorted(fair)[len(fair) // 2] < 0.5, fair  # its median: a batch or two
    assert max(fair) < min(fifo), (fair, fifo)
    assert fair_queues(redis_client) == 0 and backlog_counts(redis_client) == 0
    assert flow_counts(redis_client) == 0  # every flow's count left with its tasks


async def test_a_task_waiting_in_fair_order_is_cancelled_and_leaves_no_count(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    url = triton_server.grpc_url
    async with running_gateway(gateway_settings(redis_url, url, fair_share_after=1)) as client:
        ids = [await submit(client, ("one", "other")[i % 2], f"cancel-{i}") for i in range(40)]
        assert fair_queues(redis_client) > 0
        waiting = [t for t in ids if redis_client.hget(keys.task_key(
            t, keys.partition_of(t, 16)), "fair")]
        assert waiting  # some wait in a fair queue, not in a stream
        cancelled = (await client.delete(f"/v1/result/{waiting[0]}")).json()
        assert cancelled["status"] == "CANCELLED", cancelled
        async with running_batchers(batcher_settings(redis_url, url)):
            rest = [t for t in ids if t != waiting[0]]
            await asyncio.gather(*(final(client, t) for t in rest))
            assert await wait_until(lambda: backlog_counts(redis_client) == 0, 10)
            assert await wait_until(lambda: flow_counts(redis_client) == 0, 10)
    assert fair_queues(redis_client) == 0


def flows_seen(store: redis.Redis, priority: Priority) -> set[str]:
    """The flows that waited in fair order in any partition (their finish tags stay)."""
    seen = set()
    for p in range(16):
        for field in store.hkeys(keys.fair_state(p, priority)):
            name = field.decode() if isinstance(field, bytes) else str(field)
            if name.startswith("f|"):
                seen.add(name[2:])
    return seen


async def test_protocol_calls_and_job_items_wait_in_fair_order_as_their_clients(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
        tmp_path: Path) -> None:
    """Fair share is admission's: Triton's protocol (its caller, anonymous here: '') and a bulk
    job (its owner) are flows like /v1's."""
    url = triton_server.grpc_url
    gateway = gateway_settings(redis_url, url, fair_share_after=1,
                               job_store_dir=str(tmp_path / "jobs"))
    async with running_gateway(gateway) as client, \
            running_batchers(batcher_settings(redis_url, url)):
        body = b"".join(orjson.dumps({"custom_id": f"i{i}", "input": f"job {i}"}) + b"\n"
                        for i in range(48))
        job = await client.post("/v1/jobs", content=body, params={
            "model": MODEL, "client_id": "team-a", "priority": "normal"},
            headers={"Content-Type": "application/x-ndjson"})
        assert job.status_code == 202, job.text
        calls = [client.post(f"/v2/models/{MODEL}/infer", json={"inputs": [{
            "name": "INPUT", "shape": [1, 1], "datatype": "BYTES", "data": [f"oip {i}"]}]})
            for i in range(24)]
        answers = await asyncio.gather(*calls)
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]
        job_id = job.json()["job_id"]
        for _ in range(600):
            doc = (await client.get(f"/v1/jobs/{job_id}")).json()
            if doc["status"] in ("completed", "failed", "cancelled", "expired"):
                break
            await asyncio.sleep(0.1)
        assert doc["status"] == "completed", doc
    assert {f"team-a|{MODEL}", f"|{MODEL}"} <= flows_seen(redis_client, Priority.NORMAL)


async def test_an_api_keys_weight_is_its_clients_weight(
        redis_url: str, triton_server: TritonServer, redis_client: redis.Redis) -> None:
    """A credential's weight (here an API key entry's) is the one its tasks wait with."""
    url = triton_server.grpc_url
    entries = f"heavy:{key_hash('fk_heavy')}:3,light:{key_hash('fk_light')}"
    gateway = gateway_settings(redis_url, url, fair_share_after=1, auth="api_key",
                               api_keys=entries, client_weights="heavy=0.5")
    async with running_gateway(gateway) as client:
        ids = []
        for i in range(40):
            key = ("fk_heavy", "fk_light")[i % 2]
            answer = await client.post("/v1/inference", json={"model": MODEL, "input": f"k{i}"},
                                       headers={"X-API-Key": key})
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["task_id"])
        weights = {}
        for p in range(16):
            state = redis_client.hgetall(keys.fair_state(p, Priority.NORMAL))
            for field, value in state.items():
                name = field.decode() if isinstance(field, bytes) else str(field)
                if name.startswith("w|"):
                    weights[name[2:]] = float(value)
        assert weights == {f"heavy|{MODEL}": 3.0, f"light|{MODEL}": 1.0}  # the key's, not 0.5
        async with running_batchers(batcher_settings(redis_url, url)):
            for task_id in ids:
                answer = await client.get(f"/v1/result/{task_id}", params={"wait": 30},
                                          headers={"X-API-Key": ("fk_heavy", "fk_light")[
                                              ids.index(task_id) % 2]})
                assert answer.json()["status"] == "SUCCESS", answer.text
