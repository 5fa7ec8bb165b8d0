"""Query parameters against a real Redis and Triton: every ``/v1`` route refuses one it does not
take, or one given twice, with a 400 that names it, and does nothing else (nothing enqueued,
cancelled or created); ``?client_id=`` names the client of any body, the credential's only with
auth on; ``/v2`` ignores any, as Triton does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from ferry import keys
from ferry.codec import decode_task
from ferry.v1.task_pb2 import Task
from tests.conftest import TritonServer
from tests.integration.helpers import gateway_settings, running_gateway, stream_lengths
from tests.integration.test_security import ALICE, keyed

pytestmark = pytest.mark.integration

OCTETS = {"Content-Type": "application/octet-stream"}
NDJSON = {"Content-Type": "application/x-ndjson"}
MANIFEST = b'{"custom_id": "a", "input": "hello"}\n'


@pytest.fixture
async def gateway(redis_url: str, triton_server: TritonServer,
                  tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway alone: tasks stay queued, jobs stay queued (no runner)."""
    settings = gateway_settings(redis_url, triton_server.grpc_url, jobs=False,
                                job_store_dir=str(tmp_path / "jobs"))
    async with running_gateway(settings) as client:
        yield client


def queued_tasks(client: redis.Redis, partitions: int = 16) -> dict[str, Task]:
    """Every task waiting in a partition's stream, by id."""
    field = keys.TASK_FIELD.encode()
    tasks: list[Task] = []
    for stream in (s for p in range(partitions) for s in keys.partition_streams(p)):
        entries: Any = client.xrange(stream)  # [(entry id, {field: value})], bytes
        tasks += [decode_task(fields[field]) for _, fields in entries if field in fields]
    return {task.task_id: task for task in tasks}


def refusal(response: httpx.Response, code: str = "unknown_parameter") -> str:
    """The refusal's message, once its status and code are checked."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code
    message: str = error["message"]
    return message


async def test_an_unknown_parameter_on_submit_is_refused_and_nothing_is_enqueued(
    gateway: httpx.AsyncClient, redis_client: redis.Redis,
) -> None:
    for body, headers in ((b"abc", OCTETS), (b'{"input": "abc"}', {})):
        response = await gateway.post("/v1/inference?model=sim&bogus=1", content=body,
                                      headers=headers or {"Content-Type": "application/json"})
        assert refusal(response) == ("unknown query parameter(s) 'bogus'; POST /v1/inference "
                                     "takes 'client_id', 'model', 'priority', 'version'")
    repeated = await gateway.post("/v1/inference?model=sim&model=other", content=b"abc",
                                  headers=OCTETS)
    assert "'model' given more than once" in refusal(repeated, "invalid_parameter")
    assert stream_lengths(redis_client) == 0


async def test_an_unknown_parameter_on_a_task_neither_reads_nor_cancels_it(
    gateway: httpx.AsyncClient, redis_client: redis.Redis,
) -> None:
    task_id = (await gateway.post("/v1/inference?model=sim", content=b"abc",
                                  headers=OCTETS)).json()["task_id"]
    read = await gateway.get(f"/v1/result/{task_id}?wait=0&bogus=1")
    assert "'bogus'; GET /v1/result/{task_id} takes 'wait'" in refusal(read)
    waits = await gateway.get(f"/v1/result/{task_id}?wait=0&wait=1")
    assert "'wait' given more than once" in refusal(waits, "invalid_parameter")
    cancel = await gateway.delete(f"/v1/result/{task_id}?force=1")
    assert "DELETE /v1/result/{task_id} takes no query parameters" in refusal(cancel)
    assert (await gateway.get(f"/v1/result/{task_id}")).json()["status"] == "PENDING"
    assert list(queued_tasks(redis_client)) == [task_id]


async def test_the_query_names_a_raw_bodys_client(
    gateway: httpx.AsyncClient, redis_client: redis.Redis,
) -> None:
    named = await gateway.post("/v1/inference?model=sim&client_id=team-a", content=b"a",
                               headers=OCTETS)
    anonymous = await gateway.post("/v1/inference?model=sim", content=b"b", headers=OCTETS)
    both = await gateway.post("/v1/inference?client_id=team-b",
                              json={"input": "c", "client_id": "team-b"})
    queued = queued_tasks(redis_client)
    assert queued[named.json()["task_id"]].client_id == "team-a"
    assert queued[anonymous.json()["task_id"]].client_id == ""
    assert queued[both.json()["task_id"]].client_id == "team-b"
    for query, body in (("client_id=", b"d"), ("client_id=a%0Ab", b"e")):
        bad = await gateway.post(f"/v1/inference?model=sim&{query}", content=body,
                                 headers=OCTETS)
        assert "'query.client_id' must be 1 to 256" in refusal(bad, "invalid_parameter")
    other = await gateway.post("/v1/inference?client_id=bob",
                               json={"input": "f", "client_id": "alice"})
    assert "set one, or both alike" in refusal(other, "invalid_parameter")
    assert len(queued_tasks(redis_client)) == 3


async def test_with_auth_on_the_query_may_only_name_the_credentials_client(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    async with running_gateway(keyed(redis_url, triton_server.grpc_url)) as client:
        own = await client.post("/v1/inference?model=sim&client_id=alice", content=b"a",
                                headers={**OCTETS, **ALICE})
        spoof = await client.post("/v1/inference?model=sim&client_id=bob", content=b"b",
                                  headers={**OCTETS, **ALICE})
    assert own.status_code == 202, own.text
    assert spoof.status_code == 403 and spoof.json()["error"]["code"] == "client_id_mismatch"
    queued = queued_tasks(redis_client)
    assert list(queued) == [own.json()["task_id"]]
    assert queued[own.json()["task_id"]].client_id == "alice"


async def test_the_job_routes_refuse_an_unknown_parameter_and_do_nothing(
    gateway: httpx.AsyncClient,
) -> None:
    refused = await gateway.post("/v1/jobs?model=sim&bogus=1", content=MANIFEST,
                                 headers=NDJSON)
    assert "'bogus'; POST /v1/jobs takes 'callback_url', 'client_id'" in refusal(refused)
    assert (await gateway.get("/v1/jobs")).json()["data"] == []
    job = await gateway.post("/v1/jobs?model=sim", content=MANIFEST, headers=NDJSON)
    assert job.status_code == 202, job.text
    job_id = job.json()["job_id"]
    for method, path, names in (
            ("GET", "/v1/jobs?limit=5&bogus=1", "GET /v1/jobs takes 'before', 'client_id'"),
            ("GET", f"/v1/jobs/{job_id}?bogus=1", "GET /v1/jobs/{job_id} takes no query"),
            ("DELETE", f"/v1/jobs/{job_id}?bogus=1", "DELETE /v1/jobs/{job_id} takes no"),
            ("POST", f"/v1/jobs/{job_id}/retry?bogus=1", "/retry takes no query"),
            ("GET", f"/v1/jobs/{job_id}/results?bogus=1", "/results takes 'after', 'file'")):
        assert names in refusal(await gateway.request(method, path)), path
    repeated = await gateway.get("/v1/jobs?limit=1&limit=2")
    assert "'limit' given more than once" in refusal(repeated, "invalid_parameter")
    status = (await gateway.get(f"/v1/jobs/{job_id}")).json()["status"]
    assert status == "queued"  # the refused DELETE cancelled nothing
    assert len((await gateway.get("/v1/jobs")).json()["data"]) == 1


async def test_the_protocol_and_the_probes_ignore_query_parameters(
    gateway: httpx.AsyncClient,
) -> None:
    """As Triton does (it routes by the path alone), and as probes and scrapers may add their
    own parameters."""
    for path in ("/v2/models/sim?bogus=1", "/v2/health/ready?x=1", "/v2?x=1",
                 "/healthz?x=1", "/readyz?x=1", "/metrics?name[]=x"):
        response = await gateway.get(path)
        assert response.status_code == 200, (path, response.text)


async def test_the_admin_routes_refuse_an_unknown_parameter(
    redis_url: str, triton_server: TritonServer,
) -> None:
    token = "t0ken-for-the-admin-routes"
    admin = {"Authorization": f"Bearer {token}"}
    settings = gateway_settings(redis_url, triton_server.grpc_url, admin_token=token)
    async with running_gateway(settings) as client:
        for path, names in (
                ("/v1/admin/rollouts?bogus=1", "GET /v1/admin/rollouts takes no query"),
                ("/v1/admin/rollouts/sim/decisions?limit=5&bogus=1", "takes 'limit'"),
                ("/v1/admin/usage?since=1h&bogus=1", "takes 'model', 'since'")):
            assert names in refusal(await client.get(path, headers=admin)), path
        assert (await client.get("/v1/admin/usage?since=1h", headers=admin)).status_code == 200
        decisions = await client.get("/v1/admin/rollouts/sim/decisions?limit=5", headers=admin)
        assert decisions.status_code != 400, decisions.text
        unauthorised = await client.get("/v1/admin/rollouts?bogus=1")
        assert unauthorised.status_code == 401  # the token first: nothing told without it
