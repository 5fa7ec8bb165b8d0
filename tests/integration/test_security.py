"""Who may submit and who may read, against real servers: API keys and JWTs (401 and nothing
enqueued otherwise), tasks bound to their owner (another client's task is a 404 like an unknown
one), per-client rate limits shared by two gateway processes, and per-client bounds."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ferry import keys
from ferry.auth import api_keys
from ferry.auth import jwt as ferry_jwt
from ferry.errors import UnauthorizedError
from ferry.settings import GatewaySettings, to_env
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with
from tests.conftest import TritonServer
from tests.integration.helpers import (
    batcher_settings,
    gateway_settings,
    running_app,
    running_gateway,
    running_stack,
    stream_lengths,
    task_keys,
    wait_until,
)

pytestmark = pytest.mark.integration

ALICE_KEY, BOB_KEY = api_keys.new_key(), api_keys.new_key()
KEYS = ",".join([api_keys.config_line("alice", ALICE_KEY), api_keys.config_line("bob", BOB_KEY)])
SECRET = "a-test-secret-of-64-characters-so-that-HS512-is-also-long-enough"
OTHER_SECRET = "another-secret-of-64-characters-so-that-it-signs-a-valid-token!!"
ALICE = {"Authorization": f"Bearer {ALICE_KEY}"}
BOB = {"X-API-Key": BOB_KEY}
OCTETS = {"Content-Type": "application/octet-stream"}


def keyed(redis_url: str, triton_url: str, **overrides: Any) -> GatewaySettings:
    return gateway_settings(redis_url, triton_url, auth="api_key", api_keys=KEYS, **overrides)


def refused_as_unauthenticated(response: httpx.Response) -> str:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith('Bearer realm="ferry"')
    code: str = response.json()["error"]["code"]
    return code


async def post(client: httpx.AsyncClient, payload: str, headers: dict[str, str],
               query: str = "") -> httpx.Response:
    return await client.post(f"/v1/inference{query}", content=payload.encode(),
                             headers={**OCTETS, **headers})


async def test_without_a_valid_api_key_nothing_is_enqueued(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    bad = [{}, {"Authorization": "Basic YWxpY2U6c2VjcmV0"}, {"Authorization": "Bearer"},
           {"Authorization": "Bearer fk_not-a-key"}, {"X-API-Key": "fk_not-a-key"},
           {"Authorization": f"Bearer {ALICE_KEY}x"}, {"X-API-Key": ALICE_KEY[:-1]}]
    async with running_gateway(keyed(redis_url, triton_server.grpc_url)) as client:
        codes = [refused_as_unauthenticated(await post(client, "x", headers)) for headers in bad]
        unknown = "/v1/result/" + "0" * 32
        assert refused_as_unauthenticated(await client.get(unknown)) == "unauthenticated"
        assert refused_as_unauthenticated(await client.delete(unknown)) == "unauthenticated"
        for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert (await client.get(open_path)).status_code == 200, open_path
    assert codes == ["unauthenticated", "invalid_authorization", "invalid_authorization",
                     "invalid_api_key", "invalid_api_key", "invalid_api_key", "invalid_api_key"]
    assert stream_lengths(redis_client) == 0 and task_keys(redis_client) == []


async def test_a_task_belongs_to_the_client_that_submitted_it(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    async with running_stack(keyed(redis_url, url), batcher_settings(redis_url, url)) as stack:
        client = stack.client
        accepted = await post(client, "alice's picture", ALICE)
        assert accepted.status_code == 202, accepted.text
        task_id = accepted.json()["task_id"]
        done = await client.get(f"/v1/result/{task_id}?wait=20", headers=ALICE)
        assert done.json()["status"] == "SUCCESS"
        unknown_id = "f" * 32
        for method in ("GET", "DELETE"):
            theirs = await client.request(method, f"/v1/result/{task_id}", headers=BOB)
            nobody = await client.request(method, f"/v1/result/{unknown_id}", headers=BOB)
            assert theirs.status_code == nobody.status_code == 404
            assert (theirs.json()["error"]["message"].replace(task_id, "ID")
                    == nobody.json()["error"]["message"].replace(unknown_id, "ID"))
        waited = await client.get(f"/v1/result/{task_id}?wait=1", headers=BOB)
        assert waited.status_code == 404
        # the same input from bob: the answer is shared, alice's task is not
        hit = (await client.post("/v1/inference?model=sim", content=b"alice's picture",
                                 headers={**OCTETS, **BOB, "Prefer": "wait=20"})).json()
        assert hit["cache"] == "hit" and hit["output"] == done.json()["output"]
        assert task_id not in json.dumps(hit)
        assert (await client.get(f"/v1/result/{hit['task_id']}", headers=BOB)).status_code == 200
        assert (await client.get(f"/v1/result/{hit['task_id']}",
                                 headers=ALICE)).status_code == 404
        # a body may not speak for another client
        spoof = await client.post("/v1/inference", json={"input": "x", "client_id": "bob"},
                                  headers=ALICE)
        assert spoof.status_code == 403 and spoof.json()["error"]["code"] == "client_id_mismatch"
        same = await client.post("/v1/inference", json={"input": "y", "client_id": "alice"},
                                 headers=ALICE)
        assert same.status_code == 202
        assert (await client.get(f"/v1/result/{same.json()['task_id']}?wait=20",
                                 headers=ALICE)).json()["status"] == "SUCCESS"
    assert stream_lengths(redis_client) == 0


async def test_collapsed_requests_of_two_clients_share_the_answer_not_the_task(
    redis_url: str, triton_server: TritonServer,
) -> None:
    url = triton_server.grpc_url
    async with running_gateway(keyed(redis_url, url)) as client:  # no batcher: all stay queued
        first = await post(client, "same", ALICE, "?model=sim")
        mine = await post(client, "same", ALICE, "?model=sim")
        theirs = await post(client, "same", BOB, "?model=sim")
    async with running_stack(keyed(redis_url, url), batcher_settings(redis_url, url)) as stack:
        leader = first.json()["task_id"]
        own = await stack.client.get(f"/v1/result/{mine.json()['task_id']}?wait=20",
                                     headers=ALICE)
        other = await stack.client.get(f"/v1/result/{theirs.json()['task_id']}?wait=20",
                                       headers=BOB)
    assert own.json()["collapsed_into"] == leader
    assert other.json()["status"] == "SUCCESS" and leader not in other.text
    assert other.json()["output"] == own.json()["output"]


def _token(claims: dict[str, Any], key: Any = SECRET, algorithm: str = "HS256",
           headers: dict[str, Any] | None = None) -> str:
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


def _unsigned(header: dict[str, Any], claims: dict[str, Any], key: bytes | None = None) -> str:
    """A token made by hand: ``alg: none`` (no signature), or HMAC-SHA256 under ``key``."""
    def part(value: dict[str, Any]) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")

    signing_input = part(header) + b"." + part(claims)
    signature = b"" if key is None else base64.urlsafe_b64encode(
        hmac.new(key, signing_input, hashlib.sha256).digest()).rstrip(b"=")
    return (signing_input + b"." + signature).decode()


async def test_jwts_are_verified_with_pinned_algorithms_and_claims(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    settings = gateway_settings(redis_url, triton_server.grpc_url, auth="jwt",
                                jwt_algorithms="HS256", jwt_secret=SECRET, jwt_issuer="idp",
                                jwt_audience="ferry", jwt_leeway_s=5)
    now = int(time.time())
    good = {"sub": "carol", "iss": "idp", "aud": "ferry", "exp": now + 60}
    bad = {
        "expired": _token({**good, "exp": now - 60}),
        "not yet valid": _token({**good, "nbf": now + 60}),
        "another issuer": _token({**good, "iss": "elsewhere"}),
        "another audience": _token({**good, "aud": "other"}),
        "no exp": _token({k: v for k, v in good.items() if k != "exp"}),
        "no sub": _token({k: v for k, v in good.items() if k != "sub"}),
        "another secret": _token(good, OTHER_SECRET),
        "alg none": _unsigned({"alg": "none", "typ": "JWT"}, good),
        "HS512": _token(good, SECRET, "HS512"),
        "tampered": _token(good)[:-4] + "AAAA",
        "not a JWT": "abc.def",
        "bad client id": _token({**good, "sub": "carol smith"}),
    }
    async with running_gateway(settings) as client:
        accepted = await post(client, "x", {"Authorization": f"Bearer {_token(good)}"})
        refused = {name: await post(client, "x", {"Authorization": f"Bearer {token}"})
                   for name, token in bad.items()}
    assert accepted.status_code == 202, accepted.text
    for name, response in refused.items():
        assert refused_as_unauthenticated(response) in ("invalid_token", "invalid_client_id"), name
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
    assert "expired" in refused["expired"].json()["error"]["message"]
    assert "HS512" in refused["HS512"].json()["error"]["message"]
    assert stream_lengths(redis_client) == 1


class _JwksServer:
    """Serves a JWKS document on loopback; ``keys`` can be replaced (key rotation)."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.fetches = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                body = json.dumps({"keys": outer.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self.server.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _JwksServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _rsa_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}


async def test_rs256_keys_come_from_a_jwks_url(
    redis_url: str, triton_server: TritonServer,
) -> None:
    key = rsa.generate_private_key(65537, 2048)
    claims = {"sub": "dave", "exp": int(time.time()) + 60}
    with _JwksServer() as jwks:
        jwks.keys = [_rsa_jwk(key, "k1")]
        settings = gateway_settings(redis_url, triton_server.grpc_url, auth="jwt",
                                    jwt_jwks_url=jwks.url)
        async with running_gateway(settings) as client:
            signed = _token(claims, key, "RS256", {"kid": "k1"})
            assert (await post(client, "a", {"Authorization": f"Bearer {signed}"})
                    ).status_code == 202
            made_up = _token(claims, key, "RS256", {"kid": "nobody"})
            assert refused_as_unauthenticated(await post(
                client, "c", {"Authorization": f"Bearer {made_up}"})) == "invalid_token"
            # algorithm confusion: the public key, as an HMAC secret, signs an HS256 token
            public_pem = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            confused = _unsigned({"alg": "HS256", "typ": "JWT", "kid": "k1"}, claims, public_pem)
            response = await post(client, "d", {"Authorization": f"Bearer {confused}"})
            assert refused_as_unauthenticated(response) == "invalid_token"


async def test_a_rotated_jwks_key_is_fetched_at_most_once_per_interval() -> None:
    """A key id the cached set lacks is fetched for once ``min_refetch_s`` has passed since the
    last fetch, not before; made-up key ids cost the provider at most one fetch."""
    first, second = (rsa.generate_private_key(65537, 2048) for _ in range(2))
    with _JwksServer() as server:
        server.keys = [_rsa_jwk(first, "k1")]
        jwks = ferry_jwt.Jwks(server.url, refresh_s=300.0, min_refetch_s=0.2)
        try:
            assert await jwks.key("k1") is not None
            server.keys = [_rsa_jwk(second, "k2")]  # the provider rotates its key
            with pytest.raises(UnauthorizedError):
                await jwks.key("k2")  # fetched a moment ago: not again yet
            assert server.fetches == 1
            await asyncio.sleep(0.3)  # the interval passes
            assert await jwks.key("k2") is not None
            fetches = server.fetches
            for _ in range(5):
                with pytest.raises(UnauthorizedError):
                    await jwks.key("nobody")
            assert server.fetches <= fetches + 1
        finally:
            await jwks.close()


def _gateway_process(settings: GatewaySettings, log: Path) -> tuple[ManagedProcess, str]:
    proc = ManagedProcess("gateway", [sys.executable, "-m", "ferry", "gateway"],
                          env=env_with(to_env(settings, GatewaySettings)), log_path=log)
    proc.start()
    url = f"http://{LOOPBACK}:{settings.port}"
    proc.wait_ready(lambda: http_ok(f"{url}/healthz"), 60)
    return proc, url


@pytest.fixture
def two_gateways(redis_url: str, triton_server: TritonServer,
                 tmp_path: Path) -> Iterator[list[str]]:
    procs, urls = [], []
    try:
        for name in ("one", "two"):
            settings = keyed(redis_url, triton_server.grpc_url, port=free_port(), workers=1,
                             rate_limit_per_min=60, rate_limit_burst=5, rate_limits="bob=0")
            proc, url = _gateway_process(settings, tmp_path / f"{name}.log")
            procs.append(proc)
            urls.append(url)
        yield urls
    finally:
        for proc in procs:
            proc.stop(grace_s=10)


def test_the_rate_limit_holds_across_two_gateway_processes(
    two_gateways: list[str], redis_client: redis.Redis,
) -> None:
    answers = []
    with httpx.Client(timeout=10) as client:
        for i in range(12):  # alternately to each gateway, within about a second
            answers.append(client.post(f"{two_gateways[i % 2]}/v1/inference?model=sim",
                                       content=b"%d" % i, headers={**OCTETS, **ALICE}))
        unlimited = [client.post(f"{two_gateways[i % 2]}/v1/inference?model=sim",
                                 content=b"b%d" % i, headers={**OCTETS, **BOB})
                     for i in range(12)]
    allowed = [a for a in answers if a.status_code == 202]
    limited = [a for a in answers if a.status_code == 429]
    assert 5 <= len(allowed) <= 6 and len(allowed) + len(limited) == 12  # 5 at once, 1 a second
    assert [a.status_code for a in answers[:5]] == [202] * 5
    assert allowed[0].headers["ratelimit-limit"] == "60"
    assert allowed[0].headers["ratelimit-policy"] == "60;w=60;burst=5"
    assert int(allowed[0].headers["ratelimit-remaining"]) == 4
    for answer in limited:
        assert answer.json()["error"]["code"] == "rate_limited"
        assert int(answer.headers["retry-after"]) >= 1
        assert answer.headers["ratelimit-remaining"] == "0"
    assert all(a.status_code == 202 for a in unlimited)  # bob=0: no limit for bob
    assert stream_lengths(redis_client) == len(allowed) + 12


async def test_a_low_rate_without_a_burst_limits_from_the_first_requests(
    redis_url: str, triton_server: TritonServer,
) -> None:
    """30 a minute and no burst set: 3 at once (a tenth of the rate), not the 100 a fixed
    default burst let through."""
    settings = keyed(redis_url, triton_server.grpc_url, rate_limit_per_min=30)
    async with running_gateway(settings) as client:  # no batcher: the tasks stay queued
        answers = [await post(client, f"quick {i}", ALICE) for i in range(10)]
    assert [a.status_code for a in answers] == [202] * 3 + [429] * 7
    assert answers[0].headers["ratelimit-policy"] == "30;w=60;burst=3"


async def test_a_client_holds_a_bounded_number_of_tasks_and_long_polls(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    url = triton_server.grpc_url
    settings = keyed(redis_url, url, max_pending_per_client=32, max_waits_per_client=2)
    async with running_app(settings) as (app, client):  # no batcher: everything stays pending
        answers = [await post(client, f"task {i}", ALICE) for i in range(64)]
        held = [a.json()["task_id"] for a in answers if a.status_code == 202]
        refused = [a for a in answers if a.status_code == 429]
        assert 16 <= len(held) <= 32 and len(held) + len(refused) == 64
        assert {a.json()["error"]["code"] for a in refused} == {"too_many_pending"}
        assert (await post(client, "bob's", BOB)).status_code == 202  # bob is not alice
        cancelled = await client.delete(f"/v1/result/{held[0]}", headers=ALICE)
        assert cancelled.json()["status"] == "CANCELLED"
        polls = [asyncio.create_task(client.get(f"/v1/result/{t}?wait=2", headers=ALICE))
                 for t in held[1:3]]
        assert await wait_until(lambda: app.access.open_waits("alice") == 2, 10)  # both held
        third = await client.get(f"/v1/result/{held[3]}?wait=2", headers=ALICE)
        assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_waits"
        assert [(await p).status_code for p in polls] == [200, 200]
        assert (await client.get(f"/v1/result/{held[3]}?wait=0.1",
                                 headers=ALICE)).status_code == 200
    alice = keys.client_backlog_field("alice").encode()
    assert _held(redis_client, alice) == len(held) - 1
    async with running_stack(settings, batcher_settings(redis_url, url)):
        assert await wait_until(lambda: stream_lengths(redis_client) == 0, 30)
    assert _held(redis_client, alice) == 0


def _held(client: redis.Redis, field: bytes) -> int:
    return sum(int(client.hget(keys.backlog_key(p), field) or 0) for p in range(16))


def test_no_payload_credential_or_output_reaches_the_logs(
    redis_url: str, triton_server: TritonServer, tmp_path: Path,
) -> None:
    url = triton_server.grpc_url
    settings = keyed(redis_url, url, port=free_port(), workers=1, log_level="DEBUG",
                     access_log=True)
    batcher = batcher_settings(redis_url, url, log_level="DEBUG")
    worker = ManagedProcess("batcher", [sys.executable, "-m", "ferry", "batcher"],
                            env=env_with(to_env(batcher, type(batcher))),
                            log_path=tmp_path / "batcher.log")
    worker.start()
    gateway, base = _gateway_process(settings, tmp_path / "gateway.log")
    marker = f"payload-marker-{time.time_ns()}"
    wrong_key = api_keys.new_key()
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            ids = [client.post("/v1/inference?model=sim", content=f"{marker} raw".encode(),
                               headers={**OCTETS, **ALICE}).json()["task_id"],
                   client.post("/v1/inference", json={"input": f"{marker} json",
                               "model": "sim"}, headers=BOB).json()["task_id"]]
            outputs = [client.get(f"/v1/result/{t}?wait=20", headers=h).json()
                       for t, h in zip(ids, (ALICE, BOB), strict=True)]
            assert client.post("/v1/inference", content=b"x", headers={
                **OCTETS, "Authorization": f"Bearer {wrong_key}"}).status_code == 401
            assert client.post("/v1/inference", json={"input": 5},
                               headers=ALICE).status_code == 400
    finally:
        gateway.stop(grace_s=10)
        worker.stop(grace_s=10)
    assert [o["status"] for o in outputs] == ["SUCCESS", "SUCCESS"]
    logs = (tmp_path / "gateway.log").read_text() + (tmp_path / "batcher.log").read_text()
    assert "invalid_api_key" in logs and "POST /v1/inference" in logs  # the logs were written
    secrets = [marker, ALICE_KEY, BOB_KEY, wrong_key, SECRET,
               *(o["output"]["OUTPUT"]["sha256"] for o in outputs)]
    assert [s for s in secrets if s in logs] == []


async def test_es256_tokens_verify_against_a_pem_public_key(
    redis_url: str, triton_server: TritonServer, redis_client: redis.Redis,
) -> None:
    signer, stranger = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    public_pem = signer.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    settings = gateway_settings(redis_url, triton_server.grpc_url, auth="jwt",
                                jwt_algorithms="ES256", jwt_public_key=public_pem,
                                jwt_client_claim="client")
    claims = {"client": "erin", "exp": int(time.time()) + 60}
    async with running_gateway(settings) as client:
        good = await post(client, "e", {
            "Authorization": f"Bearer {_token(claims, signer, 'ES256')}"})
        forged = await post(client, "e", {
            "Authorization": f"Bearer {_token(claims, stranger, 'ES256')}"})
        mine = await client.get(good.headers["location"], headers={
            "Authorization": f"Bearer {_token(claims, signer, 'ES256')}"})
    assert good.status_code == 202 and mine.status_code == 200
    assert refused_as_unauthenticated(forged) == "invalid_token"
    assert stream_lengths(redis_client) == 1
