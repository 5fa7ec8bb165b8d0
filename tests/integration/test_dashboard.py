"""Every series the Grafana dashboard queries exists: Ferry's in the gateway's and the batcher's
metrics, Triton's inference metrics in a real tritonserver's /metrics. Triton's GPU metrics
cannot exist without a GPU: those are checked against the names Triton documents."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from ferry.telemetry.metrics import BatcherMetrics, GatewayMetrics
from tests.conftest import TritonServer

pytestmark = pytest.mark.integration

DASHBOARD = (Path(__file__).resolve().parents[2] / "deploy" / "helm" / "ferry" / "dashboards"
             / "ferry-dashboard.json")
TRITON_GPU_METRICS = {"nv_gpu_utilization", "nv_gpu_memory_used_bytes",
                      "nv_gpu_memory_total_bytes", "nv_gpu_power_usage"}
SUFFIXES = ("_bucket", "_sum", "_count")


def queried() -> set[str]:
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
             for t in p["targets"]]
    names = set()
    for expr in exprs:
        for found in re.findall(r"\b((?:ferry|nv)_[a-z_]+)\b", expr):
            names.add(re.sub(f"({'|'.join(SUFFIXES)})$", "", found))
    return names


def exposed(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith(("# TYPE ", "# HELP ")):
            name = line.split()[2]
            names.update({name, name.removesuffix("_total")})
    return names


def test_every_queried_series_exists(triton_server: TritonServer) -> None:
    ferry = exposed(generate_latest(GatewayMetrics().registry).decode()
                    + generate_latest(BatcherMetrics().registry).decode())
    url = f"http://127.0.0.1:{triton_server.ports.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        triton = exposed(answer.read().decode())
    names = queried()
    assert len(names) > 15
    missing = sorted(n for n in names if n.startswith("ferry_") and n not in ferry
                     and f"{n}_total" not in ferry)
    missing += sorted(n for n in names if n.startswith("nv_") and n not in triton
                      and n not in TRITON_GPU_METRICS)
    assert missing == []
    assert {n for n in names if n.startswith("nv_inference")} <= triton
