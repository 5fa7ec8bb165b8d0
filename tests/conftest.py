"""Real servers for the integration tests: a redis-server and a tritonserver on free loopback ports.

Both start once per session; every test starts with an empty Redis. With
``FERRY_TEST_REDIS_CLUSTER=1`` the Redis is a 3-master Redis Cluster on loopback (``make test``
runs the tests marked ``cluster`` that way too), and the settings the tests build say so. Triton
serves the bundled model repository plus ``sim_slow`` (the simulator with a 1.5 s batch time) for
crash and scheduling tests, ``sim_slow2``, the same with two instances, and ``simple``, Triton's
example tensor model, for the Open Inference Protocol's tests, and models with several versions
(``tests/version_models.py``).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import pytest
import redis
import tritonclient.http as triton_http

from ferry.stack.ports import LOOPBACK, free_port, is_listening
from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import start_redis, start_redis_cluster
from ferry.stack.triton_server import TritonPorts, start_triton
from ferry.stack.up import bundled_repository
from tests.tensor_models import add_tensor_models
from tests.version_models import add_version_models


@dataclass(frozen=True)
class TritonServer:
    grpc_url: str
    ports: TritonPorts
    repository: Path
    process: ManagedProcess


def copy_sim(sim: Path, model: Path, *, max_batch: int = 64, fixed_ms: str = "",
             per_item_ms: str = "", instances: int = 1) -> Path:
    """The simulator ``sim`` copied as ``model`` (named after its folder), with another max
    batch, batch time (t(B) = fixed_ms + per_item_ms · B) or instance count."""
    shutil.copytree(sim, model, ignore=shutil.ignore_patterns("__pycache__"))
    config = (model / "config.pbtxt").read_text().replace('name: "sim"', f'name: "{model.name}"')
    config = config.replace("max_batch_size: 64", f"max_batch_size: {max_batch}")
    for key, value in (("fixed_ms", fixed_ms), ("per_item_ms", per_item_ms)):
        if value:
            config = re.sub(rf'key: "{key}" value: {{ string_value: "[0-9.]+" }}',
                            f'key: "{key}" value: {{ string_value: "{value}" }}', config)
    config = config.replace("count: 1, kind: KIND_CPU", f"count: {instances}, kind: KIND_CPU")
    (model / "config.pbtxt").write_text(config)
    return model


def build_test_repository(target: Path) -> Path:
    """The bundled models plus ``sim_slow`` and ``sim_slow2``: copies of ``sim`` that take 1.5 s
    per batch, with one and two instances; and ``sim_overload``, t(B) = 50 + 2·B ms with batches
    of at most 8 (121 tasks/s)."""
    shutil.copytree(bundled_repository(), target, ignore=shutil.ignore_patterns("__pycache__"))
    for name, instances in (("sim_slow", 1), ("sim_slow2", 2)):
        copy_sim(target / "sim", target / name, fixed_ms="1500", instances=instances)
    # the slow backend, small batches: capacity 121/s
    copy_sim(target / "sim", target / "sim_overload", max_batch=8, fixed_ms="50",
             per_item_ms="2")
    add_tensorrt_ensemble(target)
    add_simple(target)
    add_tensor_models(target)
    add_version_models(target)
    return target


SIMPLE_CONFIG = """name: "simple"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def add_simple(target: Path) -> None:
    """Triton's example ``simple`` (sum and difference of two FP32 [16] inputs, batches of up
    to 8 rows, no dynamic batching: each request is executed as it comes)."""
    model = target / "simple"
    (model / "1").mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "integration" / "standin" / "simple.py",
                model / "1" / "model.py")
    (model / "config.pbtxt").write_text(SIMPLE_CONFIG)


PRODUCTION_MODELS = Path(__file__).resolve().parents[1] / "deploy" / "triton" / "models"


def add_tensorrt_ensemble(target: Path) -> None:
    """The production moderation ensemble of ``deploy/triton/models``, as ``moderation_ensemble``
    (the local ``moderation`` keeps its name), with its TensorRT step replaced by a stand-in that
    runs the same ONNX file with onnxruntime behind the same inputs and outputs."""
    for name in ("moderation_pre", "moderation_post"):  # with the local model's code, as the
        shutil.copytree(PRODUCTION_MODELS / name, target / name)  # image has them
        shutil.copy(target / "moderation" / "1" / "moderation_ops.py", target / name / "1")
    ensemble = target / "moderation_ensemble"
    shutil.copytree(PRODUCTION_MODELS / "moderation", ensemble)
    config = (ensemble / "config.pbtxt").read_text()
    (ensemble / "config.pbtxt").write_text(
        config.replace('name: "moderation"', 'name: "moderation_ensemble"'))
    engine = target / "moderation_trt"
    (engine / "1").mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "integration" / "standin" / "detector.py",
                engine / "1" / "model.py")
    config = (PRODUCTION_MODELS / "moderation_trt" / "config.pbtxt").read_text()
    config = config.replace('platform: "tensorrt_plan"', 'backend: "python"')
    config, swapped = re.subn(r"instance_group \[.*?\n\]", "instance_group [ { count: 2, "
                              "kind: KIND_CPU } ]", config, flags=re.DOTALL)
    assert swapped == 1, "moderation_trt's instance_group changed shape"
    (engine / "config.pbtxt").write_text(config)


REDIS_CLUSTER = os.environ.get("FERRY_TEST_REDIS_CLUSTER") == "1"
MOTO_SERVER = Path(__file__).resolve().parents[1] / ".tools/s3/venv/bin/moto_server"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                  "AWS_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3Server:
    """An S3-compatible server on loopback (moto's); ``bucket`` exists."""

    endpoint: str
    bucket: str


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    assert MOTO_SERVER.exists(), f"{MOTO_SERVER} is missing: run make tools"
    port = free_port()
    proc = ManagedProcess("moto_server", [str(MOTO_SERVER), "-H", LOOPBACK, "-p", str(port)],
                          log_path=tmp_path_factory.mktemp("s3") / "moto.log")
    proc.start()
    endpoint = f"http://{LOOPBACK}:{port}"
    proc.wait_ready(lambda: is_listening(LOOPBACK, port), 60)
    created = httpx.put(f"{endpoint}/ferry-jobs", timeout=10)  # CreateBucket
    assert created.status_code == 200, created.text
    yield S3Server(endpoint, "ferry-jobs")
    proc.stop(grace_s=5)


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The session's S3 server, with credentials in the environment (obstore reads them)."""
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if REDIS_CLUSTER:
        nodes, url = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
        yield url
        for node in nodes:
            node.stop(grace_s=5)
        return
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
def triton(triton_server: TritonServer) -> Iterator[triton_http.InferenceServerClient]:
    """tritonclient's HTTP client of the session's tritonserver, for answers to compare with."""
    with triton_http.InferenceServerClient(f"{LOOPBACK}:{triton_server.ports.http}") as client:
        yield client


def sync_client(url: str) -> redis.Redis:
    """A redis-py client of the tests' Redis (of the cluster, in cluster mode: typed as a plain
    client, which the cluster client mimics for every command the tests use)."""
    if REDIS_CLUSTER:
        return cast(redis.Redis, redis.RedisCluster.from_url(url))
    return redis.Redis.from_url(url)


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """A clean Redis for each test (every master, in cluster mode)."""
    client = sync_client(redis_server)
    if REDIS_CLUSTER:
        cast(redis.RedisCluster, client).flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        client.flushall()
    yield redis_server
    client.close()


@pytest.fixture
def store(redis_server: str) -> Iterator[redis.Redis]:
    """A client of the session's Redis that flushes nothing: for modules whose Ferry runs
    for the whole module (``redis_url`` would pull its streams away from under it)."""
    client = sync_client(redis_server)
    yield client
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = sync_client(redis_url)
    yield client
    client.close()
