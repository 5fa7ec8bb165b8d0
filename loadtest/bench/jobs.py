"""``make bench``'s bulk-jobs section: the batch image warehouse, and jobs beside interactive
traffic.

1. **Throughput against batch size.** A job of sample images (generated here: distinct JPEGs,
   no download) through the moderation model, its files read by the gateway from a ``file://``
   source, with the batcher's batch limit at 8, 16, 32 and 64: images a second, and what each
   image costs (the model's execution time per image from Triton's statistics, Ferry's CPU).
   On this machine the model runs on the CPU that Ferry also uses.
2. **Hybrid.** On the slow simulated backend (t(B) = 50 + 2·B ms, sleeping: a GPU's cost without
   its CPU), interactive requests at a steady rate alone, then the same while a job runs: the
   interactive p99 with the job against without it and t(64), and how busy the backend was
   while the job had items.
3. **Cascade.** The same interactive rate while the model reviews each of its own answers at
   batch priority (``FERRY_CASCADES``, ``when: always``, the review pinned to version 1): the
   interactive p99 against its p99 alone and t(64), and how many answers were reviewed.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import matplotlib
import orjson
from PIL import Image

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from ferry.stack.up import bundled_repository
from loadtest.bench.backends import SLOW, Scenario, write_repository
from loadtest.bench.cpu import CpuMeter
from loadtest.bench.goodput import replace_section
from loadtest.bench.stack import BenchStack
from loadtest.bench.sweep import TritonStats
from loadtest.generator import run

log = logging.getLogger("loadtest.bench.jobs")
HEADING = "## Bulk jobs"
SIZES = (8, 16, 32, 64)
IMAGES = 10_000  # the job at batch 64; each other size runs SWEEP_IMAGES of them
SWEEP_IMAGES = 2_000  # each run its own images: the result cache would answer a repeat
HYBRID = Scenario(SLOW, 1)
HYBRID_SHARE = 0.35  # the interactive rate, of the slow backend's capacity at full batches
HYBRID_SECONDS = 40.0
HYBRID_ITEMS = 12_000
MAX_WAIT_MS = 50.0


@dataclass
class SizePoint:
    batch: int
    images: int
    seconds: float
    images_per_s: float
    model_ms_per_image: float  # Triton's execution time per image
    mean_batch: float
    ferry_cpu_us: float  # gateway + batcher + Redis, per image
    failed: int


@dataclass
class HybridResult:
    rate: float
    alone_p99_ms: float
    with_job_p99_ms: float
    t64_ms: float
    busy: float  # the backend's share of time executing, while the job had items
    job_items_per_s: float
    alone_errors: int
    with_job_errors: int


@dataclass
class CascadeResult:
    rate: float
    alone_p99_ms: float
    with_reviews_p99_ms: float
    t64_ms: float
    reviewed: int  # of the interactive answers sampled, those whose review had ended
    sampled: int
    errors: int


def sample_images(folder: Path, count: int) -> Path:
    """``count`` distinct JPEGs (noise and random blocks, 256x192, each from its own seed),
    kept between runs."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = folder / f"{index:05d}.jpg"
        if path.exists():
            continue
        rng = random.Random(index)
        image = Image.effect_noise((256, 192), rng.uniform(20, 90)).convert("RGB")
        for _ in range(6):
            box = sorted(rng.sample(range(256), 2)) + sorted(rng.sample(range(192), 2))
            image.paste(tuple(rng.randrange(256) for _ in range(3)),
                        (box[0], box[2], box[1], box[3]))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=80)
        path.write_bytes(buffer.getvalue())
    return folder


def uri_manifest(folder: Path, first: int, count: int) -> bytes:
    return b"".join(orjson.dumps({"custom_id": f"{i:05d}.jpg",
                                  "uri": (folder / f"{i:05d}.jpg").as_uri()}) + b"\n"
                    for i in range(first, first + count))


def image_ranges(quick: bool) -> list[tuple[int, int, int]]:
    """(batch limit, first image, images) per run, each run its own images."""
    counts = [(8, 32), (64, 32)] if quick else [
        (b, IMAGES if b == 64 else SWEEP_IMAGES) for b in SIZES]
    ranges, first = [], 0
    for batch, count in counts:
        ranges.append((batch, first, count))
        first += count
    return ranges


async def run_job(client: httpx.AsyncClient, body: bytes, model: str) -> dict[str, Any]:
    """Submit a job and wait for its end; its final record."""
    response = await client.post("/v1/jobs", content=body, params={"model": model},
                                 headers={"Content-Type": "application/x-ndjson"})
    response.raise_for_status()
    return await wait_end(client, response.json()["job_id"])


async def wait_end(client: httpx.AsyncClient, job_id: str, timeout_s: float = 3600
                   ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc: dict[str, Any] = (await client.get(f"/v1/jobs/{job_id}")).json()
        if doc.get("status") in ("completed", "failed", "cancelled", "expired"):
            return doc
        await asyncio.sleep(0.5)
    raise TimeoutError(f"job {job_id} did not end in {timeout_s:g} s")


async def size_point(stack: BenchStack, stats: TritonStats, folder: Path,
                     run_range: tuple[int, int, int]) -> SizePoint:
    """One job of ``run_range``'s images (first, count) at its batch limit."""
    batch, first, images = run_range
    meter = CpuMeter({k: v for k, v in stack.pids.items() if k != "triton"})
    before_cpu, before = meter.snapshot(), await stats.counts("moderation")
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as client:
        doc = await run_job(client, uri_manifest(folder, first, images), "moderation")
    after = await stats.counts("moderation")
    cpu = sum(CpuMeter.delta(before_cpu, meter.snapshot()).values())
    seconds = doc["completed_at"] - doc["running_at"]
    executions = max(1, after.executions - before.executions)
    inferences = max(1, after.inferences - before.inferences)
    point = SizePoint(batch, images, round(seconds, 1), round(images / seconds, 1),
                      round((after.busy_ns - before.busy_ns) / 1e6 / inferences, 2),
                      round(inferences / executions, 1), round(cpu * 1e6 / images),
                      doc["request_counts"]["failed"])
    log.info("jobs: batch %d, %d images: %.1f images/s, %.2f ms of model per image, mean batch "
             "%.1f", batch, images, point.images_per_s, point.model_ms_per_image,
             point.mean_batch)
    return point


async def batch_sizes(stack: BenchStack, folder: Path, quick: bool) -> list[SizePoint]:
    stats = TritonStats(stack.triton_grpc)
    points = []
    try:
        for batch, first, count in image_ranges(quick):
            stack.restart_batcher(max_batch=batch)
            points.append(await size_point(stack, stats, folder, (batch, first, count)))
    finally:
        await stats.close()
    return points


def text_manifest(count: int) -> bytes:
    return b"".join(orjson.dumps({"custom_id": f"t{i}", "input": f"bulk item {i} " * 8})
                    + b"\n" for i in range(count))


async def hybrid(stack: BenchStack, quick: bool) -> HybridResult:
    """Interactive traffic alone, then the same while a job runs on the same model."""
    model = HYBRID.model("ferry-1req")
    rate = round(HYBRID_SHARE * SLOW.batched_capacity(1))
    seconds = 3.0 if quick else HYBRID_SECONDS
    count = int(rate * seconds)
    url = stack.gateway_url
    alone = await run("ferry-1req", url, model, rate, count, seed=11)
    stats = TritonStats(stack.triton_grpc)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        submitted = await client.post(
            "/v1/jobs", content=text_manifest(200 if quick else HYBRID_ITEMS),
            params={"model": model}, headers={"Content-Type": "application/x-ndjson"})
        submitted.raise_for_status()
        job_id = submitted.json()["job_id"]
        await asyncio.sleep(2.0)  # the job fills the backend
        before, started = await stats.counts(model), time.monotonic()
        with_job = await run("ferry-1req", url, model, rate, count, seed=12)
        after, elapsed = await stats.counts(model), time.monotonic() - started
        during: dict[str, Any] = (await client.get(f"/v1/jobs/{job_id}")).json()
        done = await wait_end(client, job_id)
    await stats.close()
    if during["status"] != "running":
        log.warning("jobs: the job ended before the interactive run did: busy is understated")
    return HybridResult(
        rate, alone.p99_ms, with_job.p99_ms, SLOW.t_ms(64),
        round((after.busy_ns - before.busy_ns) / 1e9 / elapsed, 3),
        round(done["request_counts"]["total"] / (done["completed_at"] - done["running_at"]), 1),
        alone.count - alone.successes, with_job.count - with_job.successes)


async def cascade(stack: BenchStack, mixed: HybridResult, quick: bool) -> CascadeResult:
    """The hybrid's interactive rate again, each answer reviewed by its own model."""
    model = HYBRID.model("ferry-1req")
    stack.restart_batcher(cascades=json.dumps({model: {
        "review_model": model, "review_version": "1", "when": "always"}}))
    seconds = 3.0 if quick else HYBRID_SECONDS
    reviewed = await run("ferry-1req", stack.gateway_url, model, mixed.rate,
                         int(mixed.rate * seconds), seed=13)
    stack.wait_idle()
    ended, sampled = await _reviews_ended(stack, model, 10 if quick else 50)
    return CascadeResult(mixed.rate, mixed.alone_p99_ms, reviewed.p99_ms, SLOW.t_ms(64), ended,
                         sampled, reviewed.count - reviewed.successes)


async def _reviews_ended(stack: BenchStack, model: str, count: int) -> tuple[int, int]:
    """Of ``count`` new requests' answers, how many have a review that ended (a check that the
    cascade ran)."""
    ended = 0
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as client:
        for i in range(count):
            answer = (await client.post(f"/v1/inference?model={model}", content=f"r{i}",
                                        headers={"Content-Type": "text/plain",
                                                 "Prefer": "wait=20"})).json()
            for _ in range(100):
                record = (await client.get(f"/v1/result/{answer['task_id']}")).json()
                if record.get("review", {}).get("status") == "SUCCESS":
                    ended += 1
                    break
                await asyncio.sleep(0.1)
    return ended, count


def cascade_lines(c: CascadeResult) -> list[str]:
    within = c.with_reviews_p99_ms - c.alone_p99_ms <= c.t64_ms
    return ["**The cascade beside interactive traffic** (the same backend and rate): the model "
            "reviews each of its own answers at batch priority.", "",
            "| interactive p99 alone | with reviews | difference | t(64) | answers reviewed "
            "(of a sample) | interactive errors |", "|---|---|---|---|---|---|",
            f"| {c.alone_p99_ms:.1f} ms | {c.with_reviews_p99_ms:.1f} ms | "
            f"{c.with_reviews_p99_ms - c.alone_p99_ms:+.1f} ms | {c.t64_ms:g} ms | "
            f"{c.reviewed} of {c.sampled} | {c.errors} |", "",
            f"Target: the p99 within one batch time of its p99 alone "
            f"({'met' if within else 'missed'}).", ""]


def section(points: list[SizePoint], mixed: HybridResult, note: str) -> list[str]:
    lines = [HEADING, "", note, "",
             "**The batch image warehouse**: a job of sample images through the moderation "
             "model (the batcher's batch limit set as shown), the gateway reading each image "
             "from a `file://` source. On this machine the model runs on the same 2 cores as "
             "Ferry, so images/s is the CPU's; on a GPU the model's time per image is what "
             "batching buys.", "",
             "| batch limit | images | images/s | model ms per image | mean batch | "
             "Ferry CPU µs per image | failed |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {p.batch} | {p.images:,} | {p.images_per_s:.1f} | {p.model_ms_per_image:.2f}"
              f" | {p.mean_batch:.1f} | {p.ferry_cpu_us:,.0f} | {p.failed} |" for p in points]
    m = mixed
    within = m.with_job_p99_ms - m.alone_p99_ms <= m.t64_ms
    lines += ["", "**Jobs beside interactive traffic** (slow simulated backend, 1 instance, "
              f"t(64) = {m.t64_ms:g} ms): interactive requests (`Prefer: wait`) at "
              f"{m.rate:g}/s, alone and while a job runs.", "",
              "| interactive p99 alone | with the job | difference | t(64) | backend busy "
              "while the job had items | job items/s | interactive errors (alone, with) |",
              "|---|---|---|---|---|---|---|",
              f"| {m.alone_p99_ms:.1f} ms | {m.with_job_p99_ms:.1f} ms | "
              f"{m.with_job_p99_ms - m.alone_p99_ms:+.1f} ms | {m.t64_ms:g} ms | "
              f"{m.busy:.0%} | {m.job_items_per_s:.1f} | {m.alone_errors}, "
              f"{m.with_job_errors} |", "",
              f"Target: the p99 within one batch time of its p99 alone ("
              f"{'met' if within else 'missed'}), the backend busy 95% or more while the job "
              f"has items ({'met' if m.busy >= 0.95 else 'missed'}).", ""]
    return lines


def save(state: Path, points: list[SizePoint], mixed: HybridResult,
         reviews: CascadeResult) -> None:
    (state / "jobs.json").write_text(json.dumps({"sizes": [asdict(p) for p in points],
                                                 "hybrid": asdict(mixed),
                                                 "cascade": asdict(reviews)}))


def repository(target: Path) -> Path:
    """The slow simulated backend's model and the bundled moderation model."""
    write_repository(target, [HYBRID], MAX_WAIT_MS)
    shutil.copytree(bundled_repository() / "moderation", target / "moderation",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return target


async def measure(state: Path, quick: bool
                  ) -> tuple[list[SizePoint], HybridResult, CascadeResult]:
    """Every part, on one stack of their own (moderation and the slow backend)."""
    ranges = image_ranges(quick)
    folder = sample_images(state / "job-images", ranges[-1][1] + ranges[-1][2])
    models = repository(state / "job-models")
    stack = BenchStack(state / "jobs", models, gateway_overrides={
        "job_store_dir": str(state / "jobs" / "store"), "job_sources": folder.as_uri() + "/"})
    log.info("jobs: starting tritonserver (moderation, %s), Redis and Ferry ...", HYBRID.name)
    stack.start(default_model="moderation")
    try:
        points = await batch_sizes(stack, folder, quick)
        stack.restart_batcher(max_batch=64)
        mixed = await hybrid(stack, quick)
        reviews = await cascade(stack, mixed, quick)
    finally:
        stack.stop()
    save(state, points, mixed, reviews)
    return points, mixed, reviews


def draw(points: list[SizePoint], path: Path) -> None:
    """Images a second and the model's time per image, against the batch limit."""
    figure, rate_axis = plt.subplots(figsize=(6.4, 4.0))
    batches = [p.batch for p in points]
    rate_axis.plot(batches, [p.images_per_s for p in points], "o-", color="tab:blue")
    rate_axis.set_xlabel("batch limit (FERRY_MAX_BATCH)")
    rate_axis.set_ylabel("images/s", color="tab:blue")
    rate_axis.set_xscale("log", base=2)
    rate_axis.set_xticks(batches, [str(b) for b in batches])
    cost_axis = rate_axis.twinx()
    cost_axis.plot(batches, [p.model_ms_per_image for p in points], "s--", color="tab:red")
    cost_axis.set_ylabel("model ms per image", color="tab:red")
    rate_axis.set_title("A moderation job against the batch limit (this machine's CPU)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


async def write_section(out: Path, figures: Path, state: Path, quick: bool,
                        command: str) -> None:
    started = datetime.datetime.now(datetime.UTC)
    points, mixed, reviews = await measure(state, quick)
    minutes = (datetime.datetime.now(datetime.UTC) - started).total_seconds() / 60
    figures.mkdir(parents=True, exist_ok=True)
    figure = figures / "job-batch-sizes.png"
    draw(points, figure)
    note = (f"Measured by `{command}` on {started:%Y-%m-%d %H:%M} UTC (this part took "
            f"{minutes:.1f} minutes; alone: `.venv/bin/python -m loadtest.bench --only jobs`).")
    lines = section(points, mixed, note) + cascade_lines(reviews)
    at = lines.index("") + 3  # after the note: the figure
    lines[at:at] = [f"![images/s and model time per image against the batch limit]"
                    f"({os.path.relpath(figure, out.parent)})", ""]
    out.write_text(replace_section(out.read_text() if out.exists() else "", lines, HEADING))
