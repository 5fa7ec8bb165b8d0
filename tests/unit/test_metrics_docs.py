"""docs/metrics.md lists every metric each process registers, with its type and labels, and
nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from ferry.telemetry.metrics import BatcherMetrics, GatewayMetrics, LoggerMetrics

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(ferry_[a-z_]+)` \| (\w+) \|([a-z_, ]*)\|")


def documented() -> dict[str, dict[str, tuple[str, tuple[str, ...]]]]:
    """Per process (the page's ``## Gateway``, ``## Batcher`` and ``## Logger``): name ->
    (type, labels)."""
    pages: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {}
    section = ""
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip().lower()
        found = ROW.match(line)
        if found and section:
            labels = tuple(x.strip() for x in found.group(3).split(",") if x.strip())
            pages.setdefault(section, {})[found.group(1)] = (found.group(2), labels)
    return pages


def registered(registry: CollectorRegistry) -> dict[str, tuple[str, tuple[str, ...]]]:
    found = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        collector = registry._names_to_collectors[name]  # its label names
        found[name] = (family.type, tuple(getattr(collector, "_labelnames", ())))
    return found


def test_the_page_lists_every_metric_with_its_type_and_labels() -> None:
    pages = documented()
    assert pages["gateway"] == registered(GatewayMetrics().registry)
    assert pages["batcher"] == registered(BatcherMetrics().registry)
    assert pages["logger"] == registered(LoggerMetrics().registry)


def test_priming_makes_every_series_with_labels_exist() -> None:
    for metrics in (GatewayMetrics(), BatcherMetrics(), LoggerMetrics()):
        metrics.prime(["m"])
        empty = [f.name for f in metrics.registry.collect() if not f.samples]
        assert empty == [] or set(empty) <= {  # labelled by what a batcher finds as it runs
            "ferry_partition_depth", "ferry_partition_pending", "ferry_endpoint_inflight",
            "ferry_endpoint_batch_size", "ferry_endpoint_state"}
