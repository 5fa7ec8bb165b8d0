"""Traffic control against real servers: the bounded backlog, deadlines, priorities and the
circuit breaker with its fallback."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import redis

from ferry import keys
from ferry.batcher.worker import Batcher
from ferry.priority import Priority
from ferry.tasks.capacity import Capacity, encode
from tests.conftest import TritonServer
from tests.integration.helpers import (
    Stack,
    backlog_counts,
    batch_executions,
    batcher_settings,
    executions_since,
    gateway_settings,
    known_model,
    running_gateway,
    running_stack,
    settled_executions,
    stream_lengths,
    task_keys,
    wait_until,
)

# The cluster run repeats the admission and doorbell tests, not the breakers'.
pytestmark = [pytest.mark.integration]


async def post(client: httpx.AsyncClient, payload: str, *, model: str = "sim",
               priority: str = "normal", timeout: str | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/octet-stream"}
    if timeout is not None:
        headers["X-Request-Timeout"] = timeout
    return await client.post(f"/v1/inference?model={model}&priority={priority}",
                             content=payload.encode(), headers=headers)


def accepted_ids(responses: list[httpx.Response]) -> list[str]:
    return [str(r.json()["task_id"]) for r in responses if r.status_code == 202]


@pytest.mark.cluster
async def test_the_backlog_limit_holds_under_concurrent_bursts_from_several_gateways(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url, max_backlog=48)
    async with running_gateway(settings) as one, running_gateway(settings) as two:
        burst = [post(client, f"burst-{i}-{n}") for i in range(150)
                 for n, client in enumerate((one, two))]  # distinct: identical ones would share
        responses = await asyncio.gather(*burst)  # no batcher: nothing drains
        statuses = sorted({r.status_code for r in responses})
        admitted = accepted_ids(responses)
        refused = [r for r in responses if r.status_code == 429]
        # normal priority may fill 90% of 48 = 43, split over the 16 partitions: never more
        assert statuses == [202, 429]
        assert 32 <= len(admitted) <= 43
        assert len(admitted) + len(refused) == 300
        assert stream_lengths(redis_client) == len(admitted) == backlog_counts(redis_client)
        assert len(task_keys(redis_client)) == len(admitted)  # nothing recorded for the refused
        body = refused[0].json()["error"]
        assert body["code"] == "backlog_full" and "limit for normal priority is 43" in \
            body["message"]
        assert int(refused[0].headers["Retry-After"]) >= 1
        # low priority may fill only half of the limit, so high priority still gets in
        assert (await post(one, "low", priority="low")).status_code == 429
        async with running_stack(settings, batcher_settings(redis_url, url)) as stack:
            results = await stack.results(admitted)
            assert {r["status"] for r in results} == {"SUCCESS"}
            assert await wait_until(lambda: backlog_counts(redis_client) == 0, 5)
            assert (await post(stack.client, "after", priority="low")).status_code == 202


async def test_a_burst_while_tasks_finish_never_holds_more_than_the_limit(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """One client sends 600 tasks in waves to the slow backend (121 tasks/s) against a limit of
    100 (normal priority: 90) while a batcher finishes some: more than 90 are admitted over the
    burst (each task that finishes makes room for one), never more than 90 unfinished at once
    (each partition's count, read while it runs, stays within its share, so any sum of them
    does too), and no more than 90 plus those finished."""
    url = triton_server.grpc_url
    settings = gateway_settings(redis_url, url, max_backlog=100)
    peak, done = 0, asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, backlog_counts(redis_client))
            await asyncio.sleep(0.005)

    async with running_stack(settings, batcher_settings(redis_url, url)) as stack:
        watcher = asyncio.create_task(watch())
        responses: list[httpx.Response] = []
        for wave in range(12):  # 50 at once, twelve times over about three seconds
            responses += await asyncio.gather(*(
                stack.client.post("/v1/inference", json={
                    "model": "sim_overload", "input": f"wave-{wave}-{i}", "client_id": "flood"})
                for i in range(50)))
            await asyncio.sleep(0.25)  # pacing: the next wave
        done.set()
        await watcher
        admitted = accepted_ids(responses)
        finished = sum(1 for r in await asyncio.gather(*(
            stack.client.get(f"/v1/result/{t}") for t in admitted))
            if r.json()["status"] != "PENDING")
        assert {r.status_code for r in responses} == {202, 429}
        assert 90 < len(admitted) <= 90 + finished  # a burst's admissions: the limit and more
        assert peak <= 90  # its unfinished tasks: never more than the limit
        await stack.results(admitted)


@pytest.mark.cluster
async def test_low_priority_cannot_fill_the_room_of_high_priority(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    settings = gateway_settings(redis_url, triton_server.grpc_url, max_backlog=64)
    async with running_gateway(settings) as client:
        lows = await asyncio.gather(*(post(client, f"low-{i}", priority="low")
                                      for i in range(120)))
        highs = await asyncio.gather(*(post(client, f"high-{i}", priority="high")
                                       for i in range(120)))
    low_in, high_in = len(accepted_ids(lows)), len(accepted_ids(highs))
    assert 24 <= low_in <= 32  # half of 64: 2 per partition
    assert high_in >= 16  # the rest is still there for high priority
    assert low_in + high_in <= 64
    assert backlog_counts(redis_client) == low_in + high_in


async def test_an_expired_task_never_reaches_triton_and_its_batch_mates_succeed(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    """The batcher ends it as it boards (read here once the batcher has written it: a read of
    the gateway's after the deadline would end it first, EXPIRED all the same)."""
    url = triton_server.grpc_url
    async with running_gateway(gateway_settings(redis_url, url)) as client:
        doomed = (await post(client, "too-late", timeout="0.2")).json()["task_id"]
        fine = (await post(client, "in-time", timeout="60")).json()["task_id"]
        plain = (await post(client, "no-deadline")).json()["task_id"]
        await asyncio.sleep(0.4)  # no batcher yet: the first deadline passes in the queue
        before = batch_executions(url, "sim")
        async with running_stack(gateway_settings(redis_url, url),
                                 batcher_settings(redis_url, url)) as stack:
            in_time, other = await stack.results([fine, plain])
            key = keys.task_key(doomed, keys.partition_of(doomed, 16))
            assert await wait_until(lambda: redis_client.hget(key, "status") != b"PENDING", 10)
            (expired,) = await stack.results([doomed])
        after = batch_executions(url, "sim")
    assert expired["status"] == "EXPIRED"
    assert "deadline passed before inference" in expired["error"]
    assert "output" not in expired
    assert expired["deadline_at"] == pytest.approx(expired["created_at"] + 0.2, abs=0.002)
    assert in_time["status"] == other["status"] == "SUCCESS"
    assert "deadline_at" not in other
    assert sum(size * n for size, n in executions_since(before, after).items()) == 2


@pytest.mark.cluster
async def test_a_wait_longer_than_the_deadline_is_refused_at_admission(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    # what a batcher reports after measuring the model: 16 tasks/s, half a second per batch
    redis_client.hset(keys.CAPACITY_KEY, "sim|measured",
                      encode(Capacity(rate=16.0, batch_s=0.5), time.time()))
    async with running_gateway(gateway_settings(redis_url, triton_server.grpc_url)) as client:
        refused = await post(client, "hurry", timeout="0.3")
        accepted = await post(client, "patient", timeout="5")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "deadline_unmeetable"
    assert "predicted wait" in error["message"] and "1.00 s" in error["message"]  # 2 batches
    assert "timeout of 0.3 s" in error["message"]
    assert accepted.status_code == 202
    assert stream_lengths(redis_client) == 1 == len(task_keys(redis_client))


@pytest.mark.cluster
async def test_higher_priorities_board_and_leave_first(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    gateway = gateway_settings(redis_url, url, partitions=1)
    ids: dict[str, list[str]] = {}
    async with running_gateway(gateway) as client:
        for priority in ("low", "normal", "high"):  # the most urgent arrive last
            ids[priority] = [(await post(client, f"{priority}-{i}", priority=priority)
                              ).json()["task_id"] for i in range(12)]
    async with running_stack(gateway, batcher_settings(redis_url, url, partitions=1,
                                                       max_batch=4)) as stack:
        finished = {p: [r["finished_at"] for r in await stack.results(task_ids)]
                    for p, task_ids in ids.items()}
        records = await stack.results(ids["low"][:1])
    assert max(finished["high"]) < min(finished["normal"])
    assert max(finished["normal"]) < min(finished["low"])
    assert records[0]["priority"] == "low"


# A read of Redis by the batcher, with room for a loaded machine: on a Redis Cluster, with three
# Redis nodes, Triton and the stack on two cores, a CI run saw the batch at Triton finish 19 ms
# after a 202 and the next low batch leave at once, formed before the high task was read. Below a
# low batch's call (66 ms), so that the test still says a high task rides the next batch.
READ_S = 0.05


@pytest.mark.cluster
async def test_a_high_priority_task_rides_the_next_batch_whatever_its_doorbell(
    redis_url: str, triton_server: TritonServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a low-priority backlog drains one batch at a time (sim_overload: one instance,
    batches of 8, t(B) = 50 + 2·B ms), a high-priority task admitted at any moment leaves in the
    next batch: no more than one low batch (the one at Triton) finishes between its admission
    and its own finish (two when the one at Triton finished within ``READ_S`` of its
    admission, before the batcher could have read it). High priority is asleep each time
    (awake for 0.1 s after its bell, not 2 s) and every task rings (``BELL_MS`` 1 ms): only its
    doorbell, an entry in the normal stream, says it has work."""
    monkeypatch.setattr("ferry.queue.redis_streams.AWAKE_S", 0.1)
    monkeypatch.setattr("ferry.keys.BELL_MS", 1)
    url = triton_server.grpc_url
    # A fixed backlog limit above the 250 tasks: the automatic one, sized from the throughput
    # measured so far, refused a high task in a fresh-clone CI run (192 unfinished, a limit of
    # 173 for high priority), which is not what this test is about (test_overload's is).
    gateway = gateway_settings(redis_url, url, max_backlog=1000)
    async with running_stack(gateway, batcher_settings(redis_url, url)) as stack:
        lows = accepted_ids(await asyncio.gather(*(
            post(stack.client, f"drain-{i}", model="sim_overload", priority="low")
            for i in range(240))))
        assert len(lows) == 240
        highs: list[tuple[str, float]] = []  # each high task, and when it was admitted
        for trial in range(10):
            await asyncio.sleep(0.15 + 0.013 * trial % 0.07)  # asleep, at another phase
            answer = await post(stack.client, f"urgent-{trial}", model="sim_overload",
                                priority="high")
            assert answer.status_code == 202, (trial, answer.status_code, answer.text)
            highs.append((answer.json()["task_id"], time.time()))  # the 202 is its admission
            assert (await stack.result(highs[-1][0]))["status"] == "SUCCESS"
        low_done = [r["finished_at"] for r in await stack.results(lows, wait=30)]
        for task_id, admitted in highs:
            finished = (await stack.result(task_id))["finished_at"]
            overtaking = sorted(t for t in low_done if admitted < t < finished)
            # A slot that frees within READ_S of its admission may go to a batch formed before
            # the batcher could read it (one Redis round trip): that batch is not "after" it.
            batches = 2 if overtaking and overtaking[0] - admitted < READ_S else 1
            assert len(overtaking) <= 8 * batches, (task_id, sorted(set(overtaking)), admitted,
                                                    finished)


async def poison_until_open(stack: Stack, calls: int) -> None:
    for i in range(calls):  # one at a time: each is a call of its own
        result = (await stack.results([await stack.submit(f"poison-{i}")]))[0]
        assert result["status"] == "FAILED"


def breaker_settings(redis_url: str, url: str, **overrides: Any) -> Any:
    return batcher_settings(redis_url, url, max_attempts=1, breaker_min_calls=4,
                            breaker_cooldown_s=60.0, **overrides)


async def test_an_open_breaker_fails_fast_without_calling_triton(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             breaker_settings(redis_url, url)) as stack:
        await poison_until_open(stack, 4)
        batcher = stack.batchers[0]
        assert known_model(batcher, "sim").breaker().state(batcher.clock()).value == "open"
        before = await settled_executions(url, "sim")  # the last poison's counted too
        quick = (await stack.results([await stack.submit("good")]))[0]
        assert await settled_executions(url, "sim") == before  # Triton never saw it
        assert quick["status"] == "FAILED"
        assert "circuit open for model 'sim'" in quick["error"]
        assert "100% of its calls failed" in quick["error"]
        # once the batcher has reported it, the gateway refuses at once
        assert await wait_until(lambda: batcher.metrics.registry.get_sample_value(
            "ferry_circuit_state", {"model": "sim", "version": ""}) == 2, 5)
        refused: httpx.Response | None = None
        for _ in range(40):
            refused = await post(stack.client, "good-again")
            if refused.status_code == 503:
                break
            await asyncio.sleep(0.1)
        assert refused is not None and refused.status_code == 503
        assert refused.json()["error"]["code"] == "circuit_open"
        assert int(refused.headers["Retry-After"]) > 1
        ready = (await stack.client.get("/readyz")).json()
        assert ready["circuits"] == {"sim": "open"}


async def test_an_open_breaker_sends_work_to_the_fallback_model(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             breaker_settings(redis_url, url,
                                              fallback_models="sim=sim_slow")) as stack:
        await poison_until_open(stack, 4)
        result = (await stack.results([await stack.submit("good")]))[0]
        assert result["status"] == "SUCCESS"
        assert result["model"] == "sim" and result["answered_by"] == "sim_slow"
        async def reported() -> bool:  # the batcher's report of the open breaker, read
            ready = (await stack.client.get("/readyz")).json()
            return bool(ready["circuits"].get("sim") == "open, fallback sim_slow")
        assert await wait_until(reported, 10)
        # the gateway knows the breaker is open, and still admits: there is a fallback
        assert (await post(stack.client, "still-good")).status_code == 202


async def test_the_breaker_half_opens_and_a_good_probe_closes_it(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    settings = batcher_settings(redis_url, url, max_attempts=1, breaker_min_calls=4,
                                breaker_cooldown_s=0.5)
    async with running_stack(gateway_settings(redis_url, url), settings) as stack:
        await poison_until_open(stack, 4)
        await asyncio.sleep(0.6)  # past the 0.5 s cooldown: time itself must pass
        probe = (await stack.results([await stack.submit("good")]))[0]
        batcher: Batcher = stack.batchers[0]
        assert probe["status"] == "SUCCESS"
        assert known_model(batcher, "sim").breaker().state(batcher.clock()).value == "closed"


@pytest.mark.cluster
async def test_a_high_priority_task_rings_an_idle_batcher_awake(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(gateway_settings(redis_url, url),
                             batcher_settings(redis_url, url)) as stack:
        batcher = stack.batchers[0]
        assert await wait_until(lambda: batcher.parts.queue.awake() == [Priority.NORMAL], 5)
        answer = await post(stack.client, "urgent", priority="high")
        # the reader blocks on the normal streams only: the doorbell entry wakes it
        record = (await stack.results([answer.json()["task_id"]], wait=10))[0]
        assert record["status"] == "SUCCESS" and record["priority"] == "high"
        assert Priority.HIGH in batcher.parts.queue.awake()
        assert await wait_until(lambda: stream_lengths(redis_client) == 0, 5)  # bell answered
