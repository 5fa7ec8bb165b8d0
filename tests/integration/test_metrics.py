"""Every documented metric is served from start-up (issue 32): a gateway of two worker processes
(prometheus_client's multiprocess mode, where a series exists only once a process made it) and
a batcher, as ``ferry up`` runs them, scraped before any request."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ferry.stack.ports import LOOPBACK, free_port
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, ferry_processes, gateway_settings
from tests.unit.test_metrics_docs import documented

pytestmark = pytest.mark.integration


def series(text: str) -> dict[str, list[dict[str, str]]]:
    """Each metric family's samples' labels, by the name the docs use (counters with
    ``_total``, histograms by their own name)."""
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        found[name] = [dict(s.labels) for s in family.samples]
    return found


def test_every_documented_metric_is_served_before_any_request(
    redis_url: str, triton_server: TritonServer, tmp_path: Path,
) -> None:
    url = triton_server.grpc_url
    metrics_port = free_port()
    with ferry_processes(gateway_settings(redis_url, url, workers=2),
                         batcher_settings(redis_url, url, metrics_port=metrics_port,
                                          owned_partitions="0-3"), tmp_path) as base:
        gateway = series(httpx.get(f"{base}/metrics", timeout=10).text)
        batcher = series(httpx.get(f"http://{LOOPBACK}:{metrics_port}/metrics",
                                   timeout=10).text)
    for process, served in (("gateway", gateway), ("batcher", batcher)):
        missing = [name for name in documented()[process] if not served.get(name)]
        assert not missing, f"the {process} serves no series of {missing} at start-up"
    assert {"model": "sim", "outcome": "dropped"} in gateway["ferry_shadow_tasks_total"]
    assert {"model": "moderation", "how": "hit", "version": ""} in \
        gateway["ferry_tasks_shared_total"]
    assert {"model": "sim", "reason": "full"} in batcher["ferry_batch_flush_total"]
    assert {"partition": "3"} in batcher["ferry_partition_depth"]
