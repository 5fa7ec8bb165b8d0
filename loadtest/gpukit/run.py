"""The kit's run: Triton alone and Ferry in front of the same model, on one machine, in one go.

Steps, each within the run's time budget (a step that would not fit is recorded as skipped, and
the report is rewritten after every step, so a run cut short still leaves its figures):

1. the model repository (the classifier four ways), Redis, Triton and Ferry;
2. one request through each, checked (top-5 classes back);
3. t(B) with ``ferry plan fit`` over the model without Triton batching, sent the kit's image;
4. for 1 instance, then 2: goodput at the SLO (p99 ≤ 2·t(64) + 50 ms) of Triton alone and of
   Ferry over gRPC, then p50/p99 at 50%, 80% and 95% of the fitted capacity with Ferry's CPU
   per inference, the batch sizes Triton ran and the GPU's utilisation;
5. goodput at a tight SLO (2·t(64)), 1 instance.

perf_analyzer drives both systems the same way: gRPC, Poisson arrivals, distinct JPEGs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from ferry.stack.up import sample_image
from loadtest.bench.cpu import CpuMeter
from loadtest.bench.goodput import Goodput, search
from loadtest.bench.perf_analyzer import WINDOW_STRETCH, WINDOWS, Load, Measurement, measure
from loadtest.gpukit import gpu, images, report
from loadtest.gpukit.repository import (
    INPUT,
    MAX_BATCH,
    OUTPUT,
    Engine,
    model_name,
    variants,
    write,
)
from loadtest.gpukit.stack import PARTITIONS, KitStack, Sizing

log = logging.getLogger("gpukit")

MAX_WAIT_MS = 50.0  # Ferry's default FERRY_MAX_WAIT_MS: the SLO leaves it room
LOADS = (0.5, 0.8, 0.95)  # shares of the fitted capacity for the fixed-load runs
RESERVE_S = 20.0  # kept for stopping the stack and writing the report (at most 15% of the budget)
DISTINCT_INPUTS = 1000


def settings_env(pairs: Iterable[str], option: str = "--setting") -> dict[str, str]:
    """``FERRY_NAME=VALUE`` pairs as an environment (a clear error, naming ``option``, for
    anything else)."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("FERRY_"):
            raise SystemExit(f"{option} wants FERRY_NAME=VALUE, not {pair!r}")
        env[name] = value
    return env


@dataclass(frozen=True)
class Options:
    out: Path
    work: Path
    cpu: bool = False  # the dry run: the tiny numpy model, on this machine's CPU
    budget_s: float = 480.0
    arch: str = "resnet50"
    instance_counts: tuple[int, ...] = (1, 2)
    interval_ms: int = 700  # perf_analyzer's window; a probe takes about 3.6 of them + start-up
    threads: int = 0  # perf_analyzer's sending threads, each its own connection; 0: two per
    # gateway process (a gRPC connection is served by one of them)
    repeats: int = 5  # timed calls per batch size in the fit
    input_kind: str = "image"  # the model's ferry_input_kind: "bytes" skips the gateway's check
    gateways: int = 0  # Ferry's gateway processes; 0: sized for the cores (stack.Sizing)
    batchers: int = 0  # Ferry's batchers; 0: likewise
    redis_masters: int = 1  # Ferry's Redis: one server, or a Cluster of this many masters
    settings: tuple[str, ...] = ()  # FERRY_NAME=VALUE for Ferry's processes, over the kit's

    @property
    def engine(self) -> Engine:
        if self.cpu:
            return Engine(engine="tiny", device="cpu", arch="tiny", cuda_graphs=False,
                          input_kind=self.input_kind)
        return Engine(arch=self.arch, input_kind=self.input_kind)

    @property
    def probe_s(self) -> float:
        return WINDOWS * WINDOW_STRETCH * self.interval_ms / 1000 + 1.5


@dataclass
class Probe:
    """One perf_analyzer run and what the processes did meanwhile."""

    system: str
    model: str
    rate: float
    measured: Measurement
    inferences: int = 0  # counted by Triton for the model over the run
    executions: int = 0  # model executions (batches) Triton ran
    cpu_s: dict[str, float] = field(default_factory=dict)
    gpu: dict[str, float] | None = None
    seconds: float = 0.0

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    def cpu_us(self, group: str) -> float:
        return self.cpu_s.get(group, 0.0) / self.inferences * 1e6 if self.inferences else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["mean_batch"] = round(self.mean_batch, 2)
        data["cpu_us_per_inference"] = {g: round(self.cpu_us(g), 1) for g in self.cpu_s}
        return data


class Kit:
    """One run of the kit; ``result`` is the report's data, written after every step."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.started = time.monotonic()
        self.deadline = self.started + options.budget_s
        self.stack: KitStack | None = None
        self.sampler = gpu.Sampler()
        self.meter: CpuMeter | None = None
        self.inputs = options.work / "inputs.json"
        self.jpeg = options.work / "image.jpg"
        self.probes: list[Probe] = []
        self.threads = options.threads
        # Each of perf_analyzer's threads opens its own gRPC connection, as separate clients
        # do; by default they share one, which one gateway process would serve alone.
        os.environ["TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"] = "1"
        self.result: dict[str, Any] = {"started": datetime.now(UTC).isoformat(timespec="seconds"),
                                       "machine": machine(), "options": _options(options),
                                       "goodput": [], "loads": [], "skipped": [], "errors": []}

    def left_s(self) -> float:
        reserve = min(RESERVE_S, 0.15 * self.options.budget_s)
        return self.deadline - time.monotonic() - reserve

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.result["probes"] = [p.to_json() for p in self.probes]
        self.options.out.mkdir(parents=True, exist_ok=True)
        (self.options.out / "gpu-kit.json").write_text(json.dumps(self.result, indent=2) + "\n")
        (self.options.out / "gpu-kit.md").write_text(report.markdown(self.result))

    # -- set-up ---------------------------------------------------------------------------------

    def prepare(self) -> None:
        work, engine = self.options.work, self.options.engine
        work.mkdir(parents=True, exist_ok=True)
        served = variants(engine.arch, self.options.instance_counts)
        repository = write(work / "models", engine, served, report_dir=work / "model-reports")
        jpeg = images.base_jpeg(sample_image(), engine.image_size)
        self.jpeg.write_bytes(jpeg)
        images.input_data(self.inputs, jpeg, INPUT, DISTINCT_INPUTS)
        sizing = Sizing.for_cores(os.cpu_count() or 2)
        sizing = Sizing(gateways=self.options.gateways or sizing.gateways,
                        batchers=self.options.batchers or sizing.batchers)
        self.threads = self.options.threads or 2 * sizing.gateways
        self.result["sizing"] = {**asdict(sizing), "load_threads": self.threads,
                                 "redis_masters": self.options.redis_masters}
        self.result["image_bytes"] = len(jpeg)
        self.stack = KitStack(work / "state", repository, sizing,
                              default_model=served[0].name,  # Ferry's copy, first count
                              redis_masters=self.options.redis_masters,
                              settings=settings_env(self.options.settings))

    def start(self) -> None:
        assert self.stack is not None
        began = time.monotonic()
        self.stack.start()
        self.result["start_s"] = round(time.monotonic() - began, 1)
        reports = self.options.work / "model-reports"
        self.result["engines"] = {p.stem: json.loads(p.read_text())
                                  for p in sorted(reports.glob("*.json"))}
        self.meter = CpuMeter({"ferry": self.stack.ferry_pids, "triton": self.stack.pids["triton"],
                               "gateway": self.stack.pids["gateway"],
                               "batchers": self.stack.pids["batchers"],
                               "redis": self.stack.pids["redis"]})
        self.result["gpu_sampling"] = self.sampler.start()

    async def check(self) -> None:
        """One request through Triton alone and one through Ferry: each must answer top-5."""
        assert self.stack is not None
        jpeg = self.jpeg.read_bytes()
        answers = {system: await infer(url, model, jpeg)
                   for system, model, url in self.systems(self.options.instance_counts[0])}
        for system, answer in answers.items():
            if "top5" not in json.loads(answer):
                raise RuntimeError(f"{system} answered {answer!r}, not top-5 classes")
        self.result["check"] = {k: json.loads(v) for k, v in answers.items()}

    def fit(self) -> dict[str, Any]:
        """``ferry plan fit``, as a user runs it, on the model Ferry batches for."""
        assert self.stack is not None
        path = self.options.work / "fit.json"
        model = self.systems(self.options.instance_counts[0])[1][1]  # Ferry's: no batching
        argv = [sys.executable, "-m", "ferry", "plan", "fit", "--triton-url",
                self.stack.triton_grpc, "--model", model, "--input",
                str(self.jpeg), "--batch-sizes", "1,2,4,8,16,32,64", "--repeats",
                str(self.options.repeats), "--out", str(path)]
        done = subprocess.run(argv, capture_output=True, text=True,  # noqa: S603 - ours
                              timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ferry plan fit failed: {done.stderr[-2000:]}")
        fitted: dict[str, Any] = json.loads(path.read_text())
        self.result["fit"] = fitted
        self.result["fit_table"] = done.stdout
        return fitted

    # -- measuring ------------------------------------------------------------------------------

    async def probe(self, system: str, model: str, url: str, rate: float) -> Measurement:
        """One perf_analyzer run at ``rate``, with CPU, GPU and Triton's counts around it."""
        assert self.stack is not None and self.meter is not None
        before, counts, began = self.meter.snapshot(), await self.counts(model), time.monotonic()
        load = Load(url, model, rate, "grpc", input_data=self.inputs,
                    interval_ms=self.options.interval_ms, max_threads=self.threads)
        measured = await measure(load, self.options.work / "perf")
        if system == "ferry":
            await self.drain()
        ended = time.monotonic()
        after, counts_after = self.meter.snapshot(), await self.counts(model)
        probe = Probe(system, model, rate, measured,
                      inferences=counts_after[0] - counts[0],
                      executions=counts_after[1] - counts[1],
                      cpu_s={k: round(v, 3) for k, v in CpuMeter.delta(before, after).items()},
                      gpu=self.sampler.window(began, ended), seconds=round(ended - began, 1))
        self.probes.append(probe)
        log.info("%-6s %-22s %7.0f/s → %7.0f/s p50 %6.1f p99 %7.1f ms  batch %.1f  %s", system,
                 model, rate, measured.throughput, measured.p50_ms, measured.p99_ms,
                 probe.mean_batch, measured.errors[0] if measured.errors else "")
        return measured

    async def counts(self, model: str) -> tuple[int, int]:
        """Triton's inference and execution counts of ``model`` so far."""
        assert self.stack is not None
        url = f"http://{self.stack.triton_http}/v2/models/{model}/stats"
        async with httpx.AsyncClient(timeout=10.0) as client:
            stats = (await client.get(url)).json()["model_stats"][0]
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Wait until Ferry's partitions hold no task (after a run that overloaded it)."""
        assert self.stack is not None
        import redis.asyncio as aioredis  # noqa: PLC0415  # the kit's only Redis use

        from ferry import keys  # noqa: PLC0415

        client = (aioredis.RedisCluster if self.stack.cluster else aioredis.Redis).from_url(
            self.stack.redis_url)
        try:
            streams = [s for p in range(PARTITIONS) for s in keys.partition_streams(p)]
            stop = time.monotonic() + min(timeout_s, max(1.0, self.left_s()))
            while time.monotonic() < stop:
                if sum([int(await client.xlen(s)) for s in streams]) == 0:
                    return
                await asyncio.sleep(0.2)
        finally:
            await client.aclose()

    def fits(self, runs: int = 1) -> bool:
        return self.left_s() >= runs * self.options.probe_s

    async def goodput(self, instances: int, slo_ms: float, capacity: float, tag: str) -> None:
        """Triton alone, then Ferry: the highest rate each serves within ``slo_ms``."""
        assert self.stack is not None
        for system, model, url in self.systems(instances):
            if not self.fits(3):
                self.result["skipped"].append(f"goodput {tag}, {instances} inst., {system}: "
                                              "no time left")
                continue
            result = Goodput(f"{instances}", system, "grpc", slo_ms, ceiling=round(capacity * 1.2),
                             variant=tag)
            budgeted = partial(self._budgeted, partial(self.probe, system, model, url))
            await search(budgeted, result)
            self.result["goodput"].append(result.to_json())
            self.save()

    async def _budgeted(self, probe: Callable[[float], Any], rate: float) -> Measurement:
        if not self.fits():
            return Measurement.failed(rate, ["the kit's time budget ran out"])
        measured: Measurement = await probe(rate)
        return measured

    async def loads(self, instances: int, capacity: float) -> None:
        """p50/p99 of each system at fixed shares of the fitted capacity."""
        for share in LOADS:
            rate = float(round(share * capacity))
            row: dict[str, Any] = {"instances": instances, "share": share, "rate": rate}
            for system, model, url in self.systems(instances):
                if not self.fits():
                    self.result["skipped"].append(f"load {share:.0%}, {instances} inst., "
                                                  f"{system}: no time left")
                    continue
                await self.probe(system, model, url, rate)
                row[system] = self.probes[-1].to_json()
            self.result["loads"].append(row)
            self.save()

    async def warm_up(self, capacities: dict[int, float]) -> None:
        """A run at 30% of capacity through each system and instance count, kept out of the
        tables: Ferry sizes its backlog limit from the throughput it has measured (a cold
        gateway refuses a burst past ~100 tasks), and Triton's first calls warm up too."""
        warm = []
        for instances, capacity in capacities.items():
            for system, model, url in self.systems(instances):
                if self.fits(2):
                    await self.probe(system, model, url, float(round(0.3 * capacity)))
                    warm.append(self.probes.pop().to_json())
        self.result["warm_up"] = warm

    def systems(self, instances: int) -> list[tuple[str, str, str]]:
        assert self.stack is not None
        arch = self.options.engine.arch
        return [("triton", model_name(arch, instances, triton_batching=True),
                 self.stack.triton_grpc),
                ("ferry", model_name(arch, instances, triton_batching=False),
                 self.stack.gateway_grpc)]

    # -- the whole run --------------------------------------------------------------------------

    async def measure_all(self) -> None:
        fitted = self.fit()
        t64 = fitted["t_fixed_ms"] + MAX_BATCH * fitted["t_per_ms"]
        slo, tight = 2 * t64 + MAX_WAIT_MS, 2 * t64
        self.result["slo_ms"], self.result["tight_slo_ms"] = round(slo, 1), round(tight, 1)
        self.save()
        capacities = {n: n * MAX_BATCH / t64 * 1000 for n in self.options.instance_counts}
        self.result["capacity"] = {str(n): round(c) for n, c in capacities.items()}
        await self.warm_up(capacities)
        for instances, capacity in capacities.items():
            await self.goodput(instances, slo, capacity, "slo")
            await self.loads(instances, capacity)
        first = self.options.instance_counts[0]
        await self.goodput(first, tight, capacities[first], "tight")

    async def run(self) -> dict[str, Any]:
        try:
            self.prepare()
            self.start()
            self.save()
            await self.check()
            await self.measure_all()
        except Exception as exc:  # the report says what broke, with logs
            log.exception("the kit's run failed")
            self.result["errors"].append(f"{type(exc).__name__}: {exc}"[-4000:])
        finally:
            self.sampler.stop()
            self.save()
            if self.stack is not None:
                self.stack.stop()
            report.keep_logs(self.options.work / "state", self.options.out)
        return self.result


async def infer(url: str, model: str, jpeg: bytes) -> str:
    """One request of one image over gRPC; the answer's JSON."""
    import numpy as np  # noqa: PLC0415
    from tritonclient.grpc import aio as grpcclient  # noqa: PLC0415

    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput(INPUT, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[jpeg]], dtype=np.object_))
        result = await client.infer(model, [tensor], client_timeout=120)
        answer = result.as_numpy(OUTPUT)
        assert answer is not None
        return bytes(answer.reshape(-1)[0]).decode()
    finally:
        await client.close()


def machine() -> dict[str, Any]:
    return {"cards": gpu.cards(), "driver": gpu.driver(), "cores": os.cpu_count(),
            "python": sys.version.split()[0], "libpython": os.environ.get("FERRY_KIT_LIBPYTHON",
                                                                          "")}


def _options(options: Options) -> dict[str, Any]:
    data = asdict(options)
    data["out"], data["work"] = str(options.out), str(options.work)
    data["engine"] = asdict(options.engine)
    return data
