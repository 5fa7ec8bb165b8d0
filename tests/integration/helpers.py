"""A gateway and a batcher running in the test's own event loop, against real servers."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import tritonclient.grpc as triton_grpc
import uvicorn

from ferry import keys
from ferry.batcher.models import ModelState
from ferry.batcher.worker import Batcher
from ferry.compose.gateway import sharded_announcements
from ferry.gateway.app import create_app
from ferry.gateway.hot import HotLane
from ferry.gateway.serve import server_options
from ferry.redis_conn import lean
from ferry.resp.client import Commands, RedisAddress
from ferry.resp.cluster import ClusterClient
from ferry.resp.sharded import ShardedChannels
from ferry.resp.subscriber import Subscriber
from ferry.settings import BatcherSettings, GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_ports, http_ok
from ferry.stack.process import ManagedProcess, env_with
from ferry.tasks.record import TaskRecord
from ferry.tasks.redis_store import RedisTaskStore
from ferry.v1.task_pb2 import Task
from tests.conftest import REDIS_CLUSTER


def announcement_listener(client: Commands, redis_url: str, channel: str,
                          on_message: Callable[[bytes], None],
                          on_connect: Callable[[], None] = lambda: None,
                          partitions: int = 16) -> Subscriber | ShardedChannels:
    """Where a process hears the task ends announced on ``channel`` (``client``: the task
    store's): the channel itself, or on a Redis Cluster every partition's copy of it (the
    scripts ``SPUBLISH`` in their own slot), as the gateway listens."""
    if isinstance(client, ClusterClient):
        return sharded_announcements(client, partitions, [channel], on_message, on_connect)
    return Subscriber(RedisAddress.from_url(redis_url), channel, on_message, on_connect)


FENCE = b"ferry-test-fence"  # never a message of Ferry's own


async def fence(client: Commands, channel: str, *, sharded: bool = False,
                partitions: int = 16) -> int:
    """Publish ``FENCE`` on ``channel`` from wherever Ferry's scripts publish on it, after what
    they published: a listener that has heard every fence has heard all of that (a Redis
    server sends each subscriber what it publishes, across the cluster bus too, in the order
    it was published), so nothing more of it can still be on its way. On a Redis Cluster:
    from the master of each partition's slot, or (``sharded``, as ``announcement_listener``
    hears) on every partition's copy of the channel. Returns how many fences a listener
    hears."""
    if not isinstance(client, ClusterClient):
        await client.execute("PUBLISH", channel, FENCE)
        return 1
    tags = [keys.slot_tag(partition) for partition in range(partitions)]
    if sharded:
        for tag in tags:
            await (await client.node_of(tag)).execute("SPUBLISH", channel + tag, FENCE)
        return len(tags)
    masters = {id(node): node for node in [await client.node_of(tag) for tag in tags]}
    for node in masters.values():
        await node.execute("PUBLISH", channel, FENCE)
    return len(masters)


def calls_at_triton(metrics_url: str) -> int:
    """A batcher process's calls at Triton now, from its ``/metrics`` at ``metrics_url``
    (``ferry_endpoint_inflight``, set as a call leaves and as it ends); 0 until it serves."""
    try:
        text = httpx.get(f"{metrics_url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("ferry_endpoint_inflight{"))


def gateway_settings(redis_url: str, triton_url: str, **overrides: Any) -> GatewaySettings:
    port, grpc_port = free_ports(2)
    values: dict[str, Any] = {"redis_url": redis_url, "triton_url": triton_url,
                              "default_model": "sim", "redis_cluster": REDIS_CLUSTER,
                              "port": port, "grpc_port": grpc_port, **overrides}
    if values["grpc_port"] == values["port"]:  # a port chosen by the caller, taken again
        values["grpc_port"] = next(p for p in free_ports(2) if p != values["port"])
    return GatewaySettings(**values)


def batcher_settings(redis_url: str, triton_url: str, **overrides: Any) -> BatcherSettings:
    values: dict[str, Any] = {"redis_url": redis_url, "triton_url": triton_url,
                              "metrics_port": 0, "backoff_base_ms": 10.0, "backoff_max_ms": 50.0,
                              "redis_cluster": REDIS_CLUSTER}
    values.update(overrides)
    return BatcherSettings(**values)


@contextmanager
def ferry_processes(gateway: GatewaySettings, batcher: BatcherSettings, logs: Path,
                    extra_env: Mapping[str, str] | None = None,
                    grace_s: float = 10) -> Iterator[str]:
    """A batcher and a gateway as separate ``python -m ferry`` processes (as ``ferry up``
    runs them); yields the gateway's URL once it is ready, and stops both after."""
    procs = [ManagedProcess(name, [sys.executable, "-m", "ferry", name],
                            env=env_with({**to_env(settings, cls), **(extra_env or {})}),
                            log_path=logs / f"{name}.log")
             for name, settings, cls in (("batcher", batcher, BatcherSettings),
                                         ("gateway", gateway, GatewaySettings))]
    url = f"http://{LOOPBACK}:{gateway.port}"
    try:
        for proc in procs:
            proc.start()
        procs[1].wait_ready(lambda: http_ok(f"{url}/readyz"), 60)
        yield url
    finally:
        for proc in reversed(procs):
            proc.stop(grace_s=grace_s)


@contextmanager
def ferry_served(redis_url: str, triton_url: str, logs: Path, **gateway: Any
                 ) -> Iterator[Served]:
    """A gateway (one worker; ``gateway``: its other settings) and a batcher, in processes of
    their own as ``ferry up`` runs them."""
    settings = gateway_settings(redis_url, triton_url, workers=1, **gateway)
    with ferry_processes(settings, batcher_settings(redis_url, triton_url), logs) as url:
        yield Served(url, f"{LOOPBACK}:{settings.grpc_port}")


@dataclass
class Stack:
    client: httpx.AsyncClient
    batchers: list[Batcher] = field(default_factory=list)
    settings: GatewaySettings | None = None  # the gateway's, from running_stack

    async def admit_directly(self, tasks: Sequence[Task]) -> None:
        """Admit ``tasks`` through a task store of the test's own, past the gateway's
        checks (as pending records made now)."""
        assert self.settings is not None, "a stack from running_stack knows its settings"
        async with task_store(self.settings) as store:
            await asyncio.gather(*(store.admit(t, TaskRecord.pending(t, time.time()))
                                   for t in tasks))

    async def submit(self, payload: bytes | str, model: str = "sim",
                     content_type: str = "application/octet-stream") -> str:
        data = payload.encode() if isinstance(payload, str) else payload
        response = await self.client.post(f"/v1/inference?model={model}", content=data,
                                          headers={"Content-Type": content_type})
        assert response.status_code == 202, response.text
        return str(response.json()["task_id"])

    async def result(self, task_id: str, wait: float = 20.0) -> dict[str, Any]:
        response = await self.client.get(f"/v1/result/{task_id}", params={"wait": wait})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def results(self, task_ids: Sequence[str], wait: float = 20.0) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self.result(t, wait) for t in task_ids)))


@asynccontextmanager
async def running_gateway(settings: GatewaySettings) -> AsyncIterator[httpx.AsyncClient]:
    async with running_app(settings) as (_, client):
        yield client


@asynccontextmanager
async def running_app(settings: GatewaySettings
                      ) -> AsyncIterator[tuple[HotLane, httpx.AsyncClient]]:
    """The gateway app in this event loop (what a test observes of it) and a client of it."""
    app = create_app(settings)
    async with app.fallback.router.lifespan_context(app.fallback):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ferry.test",
                                     timeout=60) as client:
            yield app, client


@dataclass(frozen=True)
class Served:
    """A gateway serving on real ports: its base URL and its gRPC host:port."""

    http: str
    grpc: str

    @property
    def address(self) -> str:
        """The HTTP port's host:port (what ``tritonclient.http`` takes)."""
        return self.http.removeprefix("http://")


@asynccontextmanager
async def serving(settings: GatewaySettings) -> AsyncIterator[Served]:
    """The gateway on real HTTP and gRPC ports, in this event loop, until the block ends, served
    as ``ferry gateway`` serves it (its protocol and read timeouts)."""
    options = {**server_options(settings), "host": LOOPBACK, "log_level": "warning"}
    server = uvicorn.Server(uvicorn.Config(create_app(settings), **options))
    serve = asyncio.ensure_future(server.serve())
    assert await wait_until(lambda: server.started or serve.done(), 30)
    try:
        yield Served(f"http://{LOOPBACK}:{settings.port}", f"{LOOPBACK}:{settings.grpc_port}")
    finally:
        server.should_exit = True
        await serve


@asynccontextmanager
async def running_stack(gateway: GatewaySettings,
                        *batchers: BatcherSettings) -> AsyncIterator[Stack]:
    async with running_gateway(gateway) as client, running_batchers(*batchers) as started:
        yield Stack(client, started, gateway)


@asynccontextmanager
async def running_batchers(*batchers: BatcherSettings) -> AsyncIterator[list[Batcher]]:
    """Batchers in this event loop, started in turn and stopped at the end."""
    started: list[Batcher] = []
    try:
        for settings in batchers:
            batcher = Batcher.from_settings(settings)
            await batcher.start()
            started.append(batcher)
        yield started
    finally:
        for batcher in started:
            await batcher.stop()


def known_model(batcher: Batcher, model: str) -> ModelState:
    """What ``batcher`` knows of ``model``, which it has seen."""
    state = batcher.model_state(model)
    assert state is not None, f"the batcher has not seen {model!r}"
    return state


def stream_lengths(client: redis.Redis, partitions: int = 16) -> int:
    """Entries in every partition's streams, all priorities."""
    return sum(int(client.xlen(stream)) for p in range(partitions)
               for stream in keys.partition_streams(p))


def _backlog_fields(client: redis.Redis, partitions: int) -> Iterator[tuple[str, int]]:
    for p in range(partitions):
        for name, count in client.hgetall(keys.backlog_key(p)).items():
            yield (name.decode() if isinstance(name, bytes) else str(name)), int(count)


def backlog_counts(client: redis.Redis, partitions: int = 16) -> int:
    """The admission scripts' backlog counts, summed over partitions, models and priorities
    (not the owners' '@' nor the fair-share flows' '~' counts of the same tasks)."""
    return sum(count for field, count in _backlog_fields(client, partitions)
               if not field.startswith(("@", "~")))


def flow_counts(client: redis.Redis, partitions: int = 16) -> int:
    """The fair-share flows' counts of unfinished tasks, summed over partitions."""
    return sum(count for field, count in _backlog_fields(client, partitions)
               if field.startswith("~"))


def task_keys(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(match=f"{keys.PREFIX}:*:task:*"))


def pending_count(client: redis.Redis, partitions: int = 16) -> int:
    """Entries read by a batcher and not yet acknowledged, over every partition's stream."""
    total = 0
    for partition in range(partitions):
        with contextlib.suppress(redis.ResponseError):  # a stream without its group yet
            total += int(client.xpending(keys.partition_stream(partition),
                                         keys.CONSUMER_GROUP)["pending"])
    return total


def dead_letters(client: redis.Redis, partitions: int = 16) -> list[dict[bytes, bytes]]:
    """Every partition's dead letters (their fields)."""
    letters: list[dict[bytes, bytes]] = []
    for partition in range(partitions):
        entries: Any = client.xrange(keys.dead_letter_stream(partition))
        letters += [fields for _, fields in entries]
    return letters


def batch_executions(triton_url: str, model: str) -> dict[int, int]:
    """Triton's own count of executions per batch size for ``model`` (cumulative)."""
    with triton_grpc.InferenceServerClient(triton_url) as client:
        stats = client.get_inference_statistics(model, as_json=True)
    counts: dict[int, int] = {}
    for model_stats in stats.get("model_stats", []):
        for row in model_stats.get("batch_stats", []):
            counts[int(row["batch_size"])] = int(row["compute_infer"]["count"])
    return counts


async def settled_executions(triton_url: str, model: str, timeout_s: float = 5.0
                             ) -> dict[int, int]:
    """``batch_executions`` once Triton has counted what it was running: two reads 0.1 s apart
    agree. Triton counts an execution as it finishes, which can be after its answer reached
    Ferry, so a count read just after an earlier test's requests may still grow."""
    counts = batch_executions(triton_url, model)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        again = batch_executions(triton_url, model)
        if again == counts:
            break
        counts = again
    return counts


def executions_since(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    return {size: n - before.get(size, 0) for size, n in after.items() if n > before.get(size, 0)}


async def executions_counted(triton_url: str, model: str, before: dict[int, int], rows: int,
                             timeout_s: float = 10.0) -> dict[int, int]:
    """``executions_since(before, ...)`` once Triton has counted ``rows`` rows since ``before``
    (or ``timeout_s`` passed): Triton's Python backend counts an execution after its answer
    went out, so a count read just after the last answer can miss the last execution."""
    deadline = time.monotonic() + timeout_s
    while True:
        since = executions_since(before, batch_executions(triton_url, model))
        if sum(size * n for size, n in since.items()) >= rows or time.monotonic() > deadline:
            return since
        await asyncio.sleep(0.02)


async def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Whether ``predicate`` (a function, or a coroutine function) came true within
    ``timeout_s``, asked every ``interval_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = predicate()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval_s)


@asynccontextmanager
async def task_store(settings: GatewaySettings) -> AsyncIterator[RedisTaskStore]:
    """A task store of the test's own on the gateway's Redis, made as the gateway makes its
    own: to admit a task past the gateway's checks."""
    hot = lean(settings, "test-store")
    try:
        yield RedisTaskStore(hot, partitions=settings.partitions,
                             result_ttl_s=settings.result_ttl_s,
                             pending_ttl_s=settings.pending_ttl_s)
    finally:
        await hot.close()
