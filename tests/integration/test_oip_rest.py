"""Triton's REST discovery routes on the gateway: ``tritonclient.http`` pointed at Ferry gets
what the same client gets from Triton's own HTTP port (server metadata apart: Ferry's own), the
same refusals, and, with authentication on, needs the key for everything but health."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from ferry import __version__
from ferry.oip.rest import EXTENSIONS
from ferry.stack.ports import LOOPBACK
from tests.conftest import TritonServer
from tests.integration.helpers import Served, ferry_served
from tests.integration.test_security import ALICE, ALICE_KEY, KEYS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODELS = ("sim", "sim_slow2", "moderation_trt", "moderation_ensemble")


@pytest.fixture(scope="module")
def guarded_ferry(redis_server: str, triton_server: TritonServer,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A gateway that takes API keys."""
    with ferry_served(redis_server, triton_server.grpc_url, tmp_path_factory.mktemp("oip-auth"),
                      auth="api_key", api_keys=KEYS, rate_limit_per_min=0) as served:
        yield served


@pytest.fixture
def client(ferry: Served) -> Iterator[triton_http.InferenceServerClient]:
    with triton_http.InferenceServerClient(ferry.address) as ferry_client:
        yield ferry_client


def newer_fields_dropped(ours: Any, theirs: Any) -> Any:
    """``ours`` without the fields ``theirs`` lacks: tritonclient's protobuf may know fields
    this Triton release does not, which then read as their defaults (the only difference)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return {key: newer_fields_dropped(value, theirs[key]) for key, value in ours.items()
                if key in theirs}
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [newer_fields_dropped(a, b) for a, b in zip(ours, theirs, strict=True)]
    return ours


def test_health_and_server_metadata(client: triton_http.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata() == {"name": "ferry", "version": __version__,
                                            "extensions": list(EXTENSIONS)}


@pytest.mark.parametrize("model", MODELS)
def test_model_answers_are_tritons(client: triton_http.InferenceServerClient,
                                   triton: triton_http.InferenceServerClient,
                                   model: str) -> None:
    assert client.get_model_metadata(model) == triton.get_model_metadata(model)
    assert client.get_model_metadata(model, "1") == triton.get_model_metadata(model, "1")
    theirs = triton.get_model_config(model)
    assert newer_fields_dropped(client.get_model_config(model), theirs) == theirs
    assert client.is_model_ready(model) and client.is_model_ready(model, "1")
    assert not client.is_model_ready(model, "7")
    for version in ("", "1"):  # Ferry's own figures, in the shape of Triton's
        assert (stats_shape(client.get_inference_statistics(model, version))
                == stats_shape(triton.get_inference_statistics(model, version)))


def stats_shape(stats: dict[str, Any]) -> list[tuple[str, str, list[str], list[str]]]:
    """The models and versions a statistics answer lists, and the fields each one has."""
    return [(s["name"], s["version"], sorted(s), sorted(s["inference_stats"]))
            for s in stats["model_stats"]]


def test_statistics_count_ferrys_own_work(ferry: Served, client: triton_http.InferenceServerClient,
                                          triton: triton_http.InferenceServerClient) -> None:
    before = client.get_inference_statistics("sim", "1")["model_stats"][0]
    for text in (uuid.uuid4().hex for _ in range(3)):
        answer = httpx.post(f"{ferry.http}/v1/inference?model=sim", content=text,
                            headers={"Prefer": "wait=10", "Content-Type": "text/plain"},
                            timeout=20)
        assert answer.status_code == 200, answer.text
    deadline, after = time.monotonic() + 10, before
    while after["inference_count"] < before["inference_count"] + 3 \
            and time.monotonic() < deadline:  # added into Redis a few times a second
        after = client.get_inference_statistics("sim", "1")["model_stats"][0]
    counted = {name: after["inference_stats"][name]["count"]
               - before["inference_stats"][name]["count"] for name in after["inference_stats"]}
    assert after["inference_count"] - before["inference_count"] == 3
    assert counted == {"success": 3, "fail": 0, "queue": 3, "compute_input": 3,
                       "compute_infer": 3, "compute_output": 3, "cache_hit": 0, "cache_miss": 0}
    every, tritons = client.get_inference_statistics(), triton.get_inference_statistics()
    assert stats_shape(every) == stats_shape(tritons)  # every model, as Triton lists them
    steps = [s for s in every["model_stats"] if s["name"] == "moderation_pre"]
    assert steps == [s for s in tritons["model_stats"] if s["name"] == "moderation_pre"]


def refusal(call: Callable[[], Any]) -> tuple[str | None, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


@pytest.mark.parametrize("ask", [
    lambda c: c.get_model_metadata("nope"), lambda c: c.get_model_metadata("sim", "7"),
    lambda c: c.get_model_config("nope"), lambda c: c.get_model_config("sim", "7"),
    lambda c: c.get_inference_statistics("nope"),
    lambda c: c.get_inference_statistics("sim", "7"),
], ids=["metadata", "metadata-version", "config", "config-version", "stats", "stats-version"])
def test_refusals_are_tritons(client: triton_http.InferenceServerClient,
                              triton: triton_http.InferenceServerClient,
                              ask: Callable[[triton_http.InferenceServerClient], Any]) -> None:
    assert refusal(lambda: ask(client)) == refusal(lambda: ask(triton))


@pytest.mark.parametrize("path", ["/v2/models/nope", "/v2/models/sim/versions/7",
                                  "/v2/models/nope/ready", "/v2/models/sim/versions/7/ready",
                                  "/v2/models/nope/stats", "/v2/models/sim/versions/abc",
                                  "/v2/models/sim/versions/abc/config", "/v2/nothing"])
def test_error_statuses_and_bodies_are_tritons(ferry: Served, triton_server: TritonServer,
                                               path: str) -> None:
    ours = httpx.get(f"{ferry.http}{path}")
    theirs = httpx.get(f"http://{LOOPBACK}:{triton_server.ports.http}{path}")
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


def test_with_authentication_the_model_routes_need_the_key(guarded_ferry: Served) -> None:
    with triton_http.InferenceServerClient(guarded_ferry.address) as client:
        assert client.is_server_live() and client.is_server_ready()  # health stays open
        status, message = refusal(lambda: client.get_model_metadata("sim"))
        assert status == "401" and message
        assert refusal(client.get_server_metadata)[0] == "401"
        assert not client.is_model_ready("sim")
        assert client.get_model_metadata("sim", headers=ALICE)["name"] == "sim"
        assert client.is_model_ready("sim", headers={"X-API-Key": ALICE_KEY})
        assert client.get_model_config("sim", headers=ALICE)["max_batch_size"] == 64
        assert client.get_inference_statistics("sim", headers=ALICE)["model_stats"]
        assert client.get_server_metadata(headers=ALICE)["name"] == "ferry"
    answer = httpx.get(f"{guarded_ferry.http}/v2/models/sim")
    assert answer.status_code == 401 and answer.json()["error"]
    assert answer.headers["www-authenticate"].startswith("Bearer")
