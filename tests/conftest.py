"""Real servers for the integration tests: a redis-server and a tritonserver on free loopback ports.

Both start once per session; every test starts with an empty Redis. Triton serves the bundled model
repository plus ``sim_slow`` (the simulator with a 1.5 s batch time) for crash and scheduling tests,
and ``sim_slow2``, the same with two instances.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import start_redis
from ferry.stack.triton_server import TritonPorts, start_triton
from ferry.stack.up import bundled_repository


@dataclass(frozen=True)
class TritonServer:
    grpc_url: str
    ports: TritonPorts
    repository: Path
    process: ManagedProcess


def build_test_repository(target: Path) -> Path:
    """The bundled models plus ``sim_slow`` and ``sim_slow2``: copies of ``sim`` that take 1.5 s
    per batch, with one and two instances; and ``sim_overload``, t(B) = 50 + 2·B ms with batches
    of at most 8 (121 tasks/s)."""
    shutil.copytree(bundled_repository(), target, ignore=shutil.ignore_patterns("__pycache__"))
    for name, instances in (("sim_slow", 1), ("sim_slow2", 2)):
        slow = target / name
        shutil.copytree(target / "sim", slow)
        config = (slow / "config.pbtxt").read_text()
        config = config.replace('name: "sim"', f'name: "{name}"')
        config = re.sub(r'key: "fixed_ms" value: \{ string_value: "[0-9.]+" \}',
                        'key: "fixed_ms" value: { string_value: "1500" }', config)
        config = config.replace("count: 1, kind: KIND_CPU", f"count: {instances}, kind: KIND_CPU")
        (slow / "config.pbtxt").write_text(config)
    overload = target / "sim_overload"  # the slow backend, small batches: capacity 121/s
    shutil.copytree(target / "sim", overload)
    config = (overload / "config.pbtxt").read_text().replace('name: "sim"',
                                                              'name: "sim_overload"')
    config = config.replace("max_batch_size: 64", "max_batch_size: 8")
    config = re.sub(r'key: "fixed_ms" value: \{ string_value: "[0-9.]+" \}',
                    'key: "fixed_ms" value: { string_value: "50" }', config)
    config = re.sub(r'key: "per_item_ms" value: \{ string_value: "[0-9.]+" \}',
                    'key: "per_item_ms" value: { string_value: "2" }', config)
    (overload / "config.pbtxt").write_text(config)
    return target


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    proc.stop(grace_s=5)


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    state = tmp_path_factory.mktemp("triton")
    repository = build_test_repository(state / "models")
    proc, ports = start_triton(repository, state)
    yield TritonServer(f"127.0.0.1:{ports.grpc}", ports, repository, proc)
    proc.stop(grace_s=20)


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """A clean Redis for each test."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    yield redis_server
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
