"""TLS to Redis (mutual, with an ACL user whose password comes from a file) and to Triton (gRPC
over TLS), each against a real server on loopback with a CA made by the test."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from ferry.errors import RedisError
from ferry.redis_conn import lean
from ferry.settings import BatcherSettings, GatewaySettings, load
from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.process import ManagedProcess
from ferry.stack.triton_server import start_triton
from tests.conftest import TritonServer
from tests.integration.certs import Pair, ThrowawayCA
from tests.integration.helpers import running_stack

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-for-the-ferry-user"


@dataclass(frozen=True)
class TlsRedis:
    url: str
    ca: Path
    client: Pair
    password_file: Path


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    return ThrowawayCA(tmp_path_factory.mktemp("ca"))


def _tls_ping(port: int, ca: ThrowawayCA, client: Pair) -> bool:
    try:
        with redis.Redis(host=LOOPBACK, port=port, ssl=True, ssl_ca_certs=str(ca.path),
                         ssl_certfile=str(client.cert), ssl_keyfile=str(client.key),
                         username="ferry", password=PASSWORD, socket_timeout=1) as conn:
            return bool(conn.ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def tls_redis(ca: ThrowawayCA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """redis-server on a TLS port only, verifying client certificates, its default user off."""
    state = tmp_path_factory.mktemp("tls-redis")
    server, client = ca.issue("redis-server", server=True), ca.issue("ferry", server=False)
    port = free_port()
    binary = shutil.which("redis-server")
    assert binary is not None
    proc = ManagedProcess("redis-tls", [
        binary, "--bind", LOOPBACK, "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(server.cert), "--tls-key-file", str(server.key),
        "--tls-ca-cert-file", str(ca.path), "--tls-auth-clients", "yes",
        "--dir", str(state), "--save", "", "--appendonly", "no",
        "--user", "default", "off",
        "--user", "ferry", "on", f">{PASSWORD}", "~*", "&*", "+@all"], log_path=state / "log")
    proc.start()
    password_file = state / "password"
    password_file.write_text(PASSWORD + "\n")
    try:
        proc.wait_ready(lambda: _tls_ping(port, ca, client), 30)
        yield TlsRedis(f"rediss://{LOOPBACK}:{port}/0", ca.path, client, password_file)
    finally:
        proc.stop(grace_s=5)


def _environ(tls: TlsRedis, triton_url: str, **extra: str) -> dict[str, str]:
    return {"FERRY_REDIS_URL": tls.url, "FERRY_TRITON_URL": triton_url,
            "FERRY_REDIS_CA_FILE": str(tls.ca), "FERRY_REDIS_CERT_FILE": str(tls.client.cert),
            "FERRY_REDIS_KEY_FILE": str(tls.client.key), "FERRY_REDIS_USERNAME": "ferry",
            "FERRY_REDIS_PASSWORD_FILE": str(tls.password_file), "FERRY_DEFAULT_MODEL": "sim",
            "FERRY_METRICS_PORT": "0", **extra}


async def _ping(settings: GatewaySettings) -> object:
    client = lean(settings, "ferry-test")
    try:
        return await client.execute("PING")
    finally:
        await client.close()


async def test_redis_over_mutual_tls_with_an_acl_user_from_a_password_file(
    tls_redis: TlsRedis, triton_server: TritonServer,
) -> None:
    environ = _environ(tls_redis, triton_server.grpc_url)
    gateway, batcher = load(GatewaySettings, environ=environ), load(BatcherSettings,
                                                                    environ=environ)
    assert gateway.redis_password == PASSWORD  # from the file, without its line break
    async with running_stack(gateway, batcher) as stack:
        task_id = await stack.submit("over TLS")
        assert (await stack.result(task_id))["status"] == "SUCCESS"
        assert (await stack.client.get("/readyz")).status_code == 200
    assert await _ping(gateway) == b"PONG"
    wrong = {
        "no client certificate": {"FERRY_REDIS_CERT_FILE": "", "FERRY_REDIS_KEY_FILE": ""},
        "the system's CAs": {"FERRY_REDIS_CA_FILE": ""},
        "a wrong password": {"FERRY_REDIS_PASSWORD": "guess"},
        "no TLS": {"FERRY_REDIS_URL": tls_redis.url.replace("rediss://", "redis://")},
    }
    for name, change in wrong.items():
        settings = load(GatewaySettings, environ=_environ(tls_redis, triton_server.grpc_url,
                                                          **change))
        with pytest.raises(RedisError):
            await _ping(settings)
            pytest.fail(f"connected with {name}")


@pytest.fixture(scope="module")
def tls_triton(ca: ThrowawayCA, triton_server: TritonServer,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second tritonserver, serving the sim model with gRPC over TLS only."""
    state = tmp_path_factory.mktemp("tls-triton")
    shutil.copytree(triton_server.repository / "sim", state / "models" / "sim")
    server = ca.issue("triton", server=True)
    proc, ports = start_triton(state / "models", state, extra_args=[
        "--grpc-use-ssl=true", f"--grpc-server-cert={server.cert}",
        f"--grpc-server-key={server.key}", f"--grpc-root-cert={ca.path}"])
    try:
        yield f"{LOOPBACK}:{ports.grpc}"
    finally:
        proc.stop(grace_s=10)


async def test_triton_over_tls(tls_triton: str, ca: ThrowawayCA, redis_url: str) -> None:
    environ = {"FERRY_REDIS_URL": redis_url, "FERRY_TRITON_URL": tls_triton,
               "FERRY_TRITON_SSL": "true", "FERRY_TRITON_CA_FILE": str(ca.path),
               "FERRY_DEFAULT_MODEL": "sim", "FERRY_METRICS_PORT": "0"}
    gateway, batcher = load(GatewaySettings, environ=environ), load(BatcherSettings,
                                                                    environ=environ)
    async with running_stack(gateway, batcher) as stack:
        task_id = await stack.submit("to Triton over TLS")
        assert (await stack.result(task_id))["status"] == "SUCCESS"
    plain = {**environ, "FERRY_TRITON_SSL": "false", "FERRY_TRITON_CA_FILE": ""}
    async with running_stack(load(GatewaySettings, environ=plain)) as stack:
        started = time.monotonic()
        ready = await stack.client.get("/readyz")
        assert ready.status_code == 503 and time.monotonic() - started < 30
