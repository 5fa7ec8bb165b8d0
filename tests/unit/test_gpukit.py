"""The GPU kit's pure parts: distinct inputs, the model repository, Ferry's sizing, what travels,
and the report (the kit's runs themselves: tests/integration/test_gpu_kit.py)."""

from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from ferry.stack.up import sample_image
from loadtest.gpukit import images, report, wheels
from loadtest.gpukit.repository import Engine, config, variants, write
from loadtest.gpukit.stack import PARTITIONS, Sizing, partition_ranges


def pixels(jpeg: bytes) -> bytes:
    with Image.open(io.BytesIO(jpeg)) as image:
        return image.convert("RGB").tobytes()


def test_copies_of_the_photo_differ_in_bytes_and_decode_to_the_same_pixels() -> None:
    jpeg = images.base_jpeg(sample_image(), 64)
    first, second = images.variant(jpeg, 1), images.variant(jpeg, 2)
    assert len({jpeg, first, second}) == 3
    assert pixels(first) == pixels(second) == pixels(jpeg)
    with Image.open(io.BytesIO(first)) as image:
        assert image.size == (64, 64)


def test_only_a_jpeg_takes_a_comment() -> None:
    with pytest.raises(ValueError, match="not a JPEG"):
        images.variant(b"\x89PNG\r\n", 1)


def test_the_input_file_holds_each_copy_as_triton_serializes_bytes(tmp_path: Path) -> None:
    jpeg = images.base_jpeg(sample_image(), 32)
    path = images.input_data(tmp_path / "in.json", jpeg, "IMAGE", 3, start=10)
    steps = json.loads(path.read_text())["data"]
    raw = [base64.b64decode(step["IMAGE"]["b64"]) for step in steps]
    assert len(set(raw)) == 3
    for index, element in enumerate(raw):
        (length,) = struct.unpack("<I", element[:4])
        assert length == len(element) - 4
        assert element[4:] == images.variant(jpeg, 10 + index)


def test_ferry_gets_copies_without_triton_batching_and_triton_alone_with_it() -> None:
    served = variants("resnet50", (1, 2))
    assert [(v.name, v.instances, v.triton_batching) for v in served] == [
        ("resnet50", 1, False), ("resnet50_triton", 1, True),
        ("resnet50_x2", 2, False), ("resnet50_triton_x2", 2, True)]
    plain, batched = (config(v, Engine(), None) for v in served[2:])
    assert "dynamic_batching" not in plain
    assert "dynamic_batching { max_queue_delay_microseconds: 0 }" in batched
    for text in (plain, batched):
        assert "count: 2 kind: KIND_CPU" in text and "max_batch_size: 64" in text
        assert 'key: "ferry_input_kind" value: { string_value: "image" }' in text
        assert 'key: "engine" value: { string_value: "torch" }' in text
    unchecked = config(served[0], Engine(input_kind="bytes"), None)
    assert 'key: "ferry_input_kind" value: { string_value: "bytes" }' in unchecked


def test_the_repository_holds_the_model_and_its_configs(tmp_path: Path) -> None:
    engine = Engine(engine="tiny", device="cpu", arch="tiny", cuda_graphs=False)
    root = write(tmp_path / "models", engine, variants("tiny", (1,)), tmp_path / "reports")
    assert sorted(p.name for p in root.iterdir()) == ["tiny", "tiny_triton"]
    assert (root / "tiny" / "1" / "model.py").read_text().startswith('"""The GPU kit')
    assert f'string_value: "{tmp_path / "reports"}"' in (root / "tiny" / "config.pbtxt").read_text()


@pytest.mark.parametrize("batchers", [1, 2, 3, 5])
def test_the_batchers_own_every_partition_once(batchers: int) -> None:
    owned: list[int] = []
    for spec in partition_ranges(batchers):
        low, high = (int(x) for x in spec.split("-"))
        owned += range(low, high + 1)
    assert sorted(owned) == list(range(PARTITIONS))


def test_ferry_is_sized_for_the_cores() -> None:
    assert Sizing.for_cores(2) == Sizing(gateways=1, batchers=2)
    assert Sizing.for_cores(16) == Sizing(gateways=6, batchers=2)


def test_what_travels_is_what_ferry_needs_less_what_the_machine_has() -> None:
    needed = wheels.closure()
    assert {"fastapi", "redis", "grpcio", "tritonclient", "uvicorn"} <= set(needed)
    assert "kubernetes" not in needed and "nvidia-pytriton" not in needed
    carried = wheels.carried(needed)
    assert {"grpcio", "protobuf", "fastapi", "pydantic-core"} <= set(carried)
    assert not {"numpy", "pillow", "httpx", "uvloop"} & set(carried)
    assert all(carried[name] == needed[name] for name in carried)


def probe(system: str, rate: float, p99: float, errors: list[str] | None = None) -> dict[str, Any]:
    return {"system": system, "model": f"m_{system}", "rate": rate, "inferences": 1000,
            "executions": 100, "mean_batch": 10.0, "seconds": 4.0,
            "cpu_s": {"ferry": 2.0}, "cpu_us_per_inference": {"ferry": 2000.0},
            "gpu": {"util_pct": 50.0, "memory_mib": 1.0, "samples": 3},
            "measured": {"rate": rate, "throughput": rate * 0.98, "p50_ms": p99 / 2,
                         "p90_ms": p99, "p95_ms": p99, "p99_ms": p99, "requests": 100,
                         "errors": errors or []}}


def test_the_report_pairs_the_systems_and_says_what_failed() -> None:
    good = {"rate": 3000.0, "ceiling": 5000, "slo_ms": 80.0, "scenario": "1", "variant": "slo",
            "at": {"p99_ms": 30.0}}
    result = {"started": "2026-11-27T00:00:00+00:00", "elapsed_s": 10.0,
              "machine": {"cards": ["GPU 0: NVIDIA H200 (UUID: x)"], "cores": 16},
              "fit": {"t_fixed_ms": 2.0, "t_per_ms": 0.2, "r2": 0.99}, "capacity": {"1": 4571},
              "slo_ms": 79.6, "tight_slo_ms": 29.6,
              "goodput": [{**good, "system": "triton"}, {**good, "system": "ferry",
                                                         "rate": 2400.0}],
              "loads": [{"instances": 1, "share": 0.8, "rate": 3600.0,
                         "triton": probe("triton", 3600, 20.0),
                         "ferry": probe("ferry", 3600, 0, ["CANCELLED"])}],
              "probes": [probe("triton", 3600, 20.0)], "skipped": ["goodput tight: no time left"],
              "errors": []}
    text = report.markdown(result)
    assert text.startswith("# Ferry and Triton alone on GPU 0: NVIDIA H200\n")
    assert "| 1 | 80.0 ms | 3,000/s | 30.0 ms | 2,400/s | 30.0 ms | 0.80 |" in text
    assert "| 1 | 80% | 3,600 | 3,528, 10.0 / 20.0, 10.0, 50% | error: CANCELLED |" in text
    assert "- goodput tight: no time left" in text
    assert "t(64) = 14.8 ms" in text


def test_the_report_sets_the_batches_ferry_sent_beside_triton_alones() -> None:
    def at(share: float, ferry_batch: float) -> dict[str, Any]:
        return {"instances": 2, "share": share, "rate": 1000.0,
                "triton": probe("triton", 1000, 20.0),
                "ferry": {**probe("ferry", 1000, 21.0), "mean_batch": ferry_batch}}

    result = {"started": "2026-11-28T00:00:00+00:00", "machine": {"cards": [], "cores": 16},
              "sizing": {"gateways": 6, "batchers": 2}, "goodput": [],
              "loads": [at(0.5, 9.5), at(0.8, 8.0), {"instances": 2, "share": 0.95,
                                                      "rate": 1200.0}],
              "probes": [], "skipped": [], "errors": []}
    text = report.markdown(result)
    assert "| 2 | 50% | 1,000 | 10.0 | 9.5 | 0.95 |" in text
    assert "| 2 | 80% | 1,000 | 10.0 | 8.0 | 0.80 |" in text
    assert "| 2 | 95% | 1,200 | not run | not run |  |" in text
    assert "those Ferry's 2 batchers sent" in text
    # the goal, at 80% load
    assert "| 2 | not measured | 21.0 against 20.0 ms: 1.05 (met) | 8.0 against 10.0: 0.80 " \
        "(**missed**) |" in text
    assert "#### Batch sizes at the fixed loads" in report.section([result], ["run.json"])
    assert report.batch_ratio(None) is None


def test_the_report_names_ferrys_redis_and_a_run_with_a_cluster_in_its_heading() -> None:
    result = {"started": "2026-11-27T13:00:00+00:00", "machine": {"cards": [], "cores": 16},
              "sizing": {"gateways": 6, "batchers": 2, "redis_masters": 3}, "goodput": [],
              "loads": [], "probes": [], "skipped": [], "errors": []}
    lines = report.section([result], ["run.json"])
    assert any(line.endswith("6 gateway processes, 2 batchers, a Redis Cluster of 3 masters")
               for line in lines if line.startswith("### "))
    assert any("2 batchers, a Redis Cluster of 3 masters; result cache" in line for line in lines)
    single = {**result, "sizing": {"gateways": 6, "batchers": 2}}  # runs from before the option
    lines = report.section([single], ["run.json"])
    assert any(line.endswith("6 gateway processes, 2 batchers") for line in lines
               if line.startswith("### "))
    assert any("2 batchers, one Redis; result cache" in line for line in lines)


def test_a_bench_run_keeps_the_gpu_section_and_the_kit_rewrites_only_it() -> None:
    from loadtest.bench.goodput import replace_section, section_of

    old = "# Bench\n\n## Sweep\n\nold\n\n## On a GPU\n\nH200 figures\n\n## Figures\n\nf\n"
    kept = section_of(old, report.HEADING)
    assert kept == ["## On a GPU", "", "H200 figures", ""]
    fresh = "# Bench\n\n## Sweep\n\nnew\n"
    assert "H200 figures" in replace_section(fresh, kept, report.HEADING)
    assert section_of(fresh, report.HEADING) == []
