"""perf_analyzer, Triton's own C++ load generator, driven from Python.

One call is one bounded open-loop run at one Poisson request rate against anything that speaks
the Open Inference Protocol (Triton itself, or Ferry's gateway), over gRPC or HTTP; its CSV report
and its console output are read into a typed :class:`Measurement`. perf_analyzer spends far less
CPU per request than a Python client, so on a small machine it competes less with what it loads.

How a run is bounded: perf_analyzer measures in windows of ``interval_ms`` and stops once the last
three agree within its stability percentage; here that percentage is so wide that the first three
windows always agree (``--max-trials 3``), so a run lasts about 3 windows (each about 1.2 times
``interval_ms``) plus start-up, and the subprocess is killed past ``timeout_s``. Latency is
perf_analyzer's: from a request's send to its answer, counted for the requests that completed
within the windows (so ``throughput`` falling short of ``rate`` is the sign of a server that did
not keep up). perf_analyzer stops at the first failed request and writes no CSV: a failed run is
a :class:`Measurement` whose ``errors`` say why.

Installed by ``scripts/install-perf-analyzer.sh`` (``make tools``) into ``.tools/``.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / ".tools" / "bin" / "perf_analyzer"
WINDOWS = 3  # perf_analyzer's stability window: the fewest measurements it takes
WINDOW_STRETCH = 1.2  # a time window lasts about this much longer than asked
START_UP_S = 10.0  # beyond the windows: start-up, and the answers still in flight

Protocol = Literal["grpc", "http"]
_ERROR = re.compile(r"had error: (.*)")
_COUNT = re.compile(r"^\s*Request count: (\d+)", re.MULTILINE)


class PerfAnalyzerMissing(RuntimeError):
    """perf_analyzer is not installed where Ferry's tooling puts it."""


def binary() -> Path:
    """The wrapper ``make tools`` installs (it sets the library path the binary needs), or the
    one ``FERRY_PERF_ANALYZER`` names (the GPU kit's, scripts/gpu-kit.sh)."""
    given = os.environ.get("FERRY_PERF_ANALYZER", "")
    if given:
        return Path(given)
    if not BINARY.exists():
        raise PerfAnalyzerMissing(f"{BINARY} is missing: run `make tools` "
                                  "(scripts/install-perf-analyzer.sh) to install perf_analyzer")
    return BINARY


@dataclass(frozen=True)
class Load:
    """One run: ``model`` at ``url`` (host:port), Poisson arrivals at ``rate`` per second."""

    url: str
    model: str
    rate: float
    protocol: Protocol = "grpc"
    shapes: tuple[str, ...] = ()  # "NAME:d1,d2" for inputs of variable shape
    input_data: Path | None = None  # a JSON file of inputs (needed for BYTES models like sim)
    interval_ms: int = 1000
    max_threads: int = 1  # one thread sends the inputs in order: no two requests alike
    headers: tuple[str, ...] = ()  # "Name:Value", HTTP only

    @property
    def timeout_s(self) -> float:
        return WINDOWS * WINDOW_STRETCH * self.interval_ms / 1000 + START_UP_S

    def argv(self, report: Path) -> list[str]:
        args = [str(binary()), "-m", self.model, "-u", self.url, "-i", self.protocol, "--async",
                "--request-rate-range", f"{self.rate:g}", "--request-distribution", "poisson",
                "--measurement-interval", str(self.interval_ms), "--percentile=99",
                "--stability-percentage", "100000", "--max-trials", str(WINDOWS),
                "--max-threads", str(self.max_threads), "-f", str(report)]
        for shape in self.shapes:
            args += ["--shape", shape]
        if self.input_data is not None:
            args += ["--input-data", str(self.input_data)]
        for header in self.headers:
            args += ["-H", header]
        return args


@dataclass(frozen=True)
class Measurement:
    """What perf_analyzer measured at one asked rate; latencies in milliseconds."""

    rate: float  # asked, requests per second
    throughput: float  # achieved, inferences per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    requests: int = 0  # requests completed within the measurement windows
    errors: tuple[str, ...] = ()  # why the run failed (each distinct message once)

    @property
    def ok(self) -> bool:
        return not self.errors

    @classmethod
    def failed(cls, rate: float, errors: Sequence[str]) -> Measurement:
        return cls(rate, 0.0, math.inf, math.inf, math.inf, math.inf, 0, tuple(errors))


def parse_csv(text: str) -> list[Measurement]:
    """Every row of perf_analyzer's ``-f`` report (run with ``--percentile``; latencies there
    are in microseconds)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    return [Measurement(rate=float(row["Request Rate"]),
                        throughput=float(row["Inferences/Second"]),
                        p50_ms=_ms(row, "p50"), p90_ms=_ms(row, "p90"), p95_ms=_ms(row, "p95"),
                        p99_ms=_ms(row, "p99")) for row in rows]


def _ms(row: dict[str, str], name: str) -> float:
    return float(row[f"{name} latency"]) / 1000.0


def parse_errors(output: str) -> tuple[str, ...]:
    """The distinct request errors perf_analyzer printed (each thread stops at its first)."""
    found = [m.group(1).strip() for m in _ERROR.finditer(output)]
    return tuple(dict.fromkeys(found))


def parse_count(output: str) -> int:
    """The last ``Request count`` of the console report (0 when there is none)."""
    counts = _COUNT.findall(output)
    return int(counts[-1]) if counts else 0


def interpret(rate: float, returncode: int, output: str, report: str) -> Measurement:
    """A run's result from its exit status, console output and CSV report."""
    errors = parse_errors(output)
    rows = parse_csv(report) if report.strip() else []
    if returncode == 0 and rows and not errors:
        row = rows[-1]
        return Measurement(row.rate, row.throughput, row.p50_ms, row.p90_ms, row.p95_ms,
                           row.p99_ms, parse_count(output))
    if not errors:
        tail = [line.strip() for line in output.splitlines() if line.strip()][-3:]
        errors = (f"perf_analyzer exited {returncode}: " + " / ".join(tail),)
    return Measurement.failed(rate, errors)


async def measure(load: Load, workdir: Path) -> Measurement:
    """Run perf_analyzer once (at most ``load.timeout_s``) and read what it measured."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / f"perf-analyzer-{uuid.uuid4().hex}.csv"
    proc = await asyncio.create_subprocess_exec(*load.argv(report),
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), load.timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return Measurement.failed(load.rate, [f"perf_analyzer ran past {load.timeout_s:g} s"])
    finally:
        text = report.read_text() if report.exists() else ""
        report.unlink(missing_ok=True)
    return interpret(load.rate, proc.returncode or 0, out.decode(errors="replace"), text)


def bytes_inputs(path: Path, name: str, count: int, size: int = 2048, tag: str = "") -> Path:
    """A ``--input-data`` file of ``count`` distinct BYTES [1] inputs of ``size`` bytes each
    (``tag`` makes them differ from another file's): perf_analyzer sends them in order, so a
    run of fewer requests repeats none, and Ferry's result cache and request collapsing, which
    key on the input's bytes, never answer one."""
    filler = "x" * size
    data = [{name: {"content": [f"{tag}{i:09d}{filler}"[:size]], "shape": [1]}}
            for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": data}))
    return path


def fp32_inputs(path: Path, names: Sequence[str], width: int, count: int,
                start: int = 0) -> Path:
    """A ``--input-data`` file of ``count`` distinct steps, each input FP32 [``width``]
    (``start`` makes them differ from another file's). perf_analyzer's own ``random`` data is
    one buffer sent with every request: against Ferry, its result cache would answer all but
    the first, and the run would measure the cache, not batching in front of Triton."""
    data = [{name: [float(step) + k / (width + 1) + n for k in range(width)]
             for n, name in enumerate(names)} for step in range(start, start + count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": data}))
    return path
