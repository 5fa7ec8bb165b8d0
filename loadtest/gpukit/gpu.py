"""What the GPU did during a run: ``nvidia-smi`` sampled in the background.

Utilisation is the driver's: the share of time in which a kernel ran, so a small kernel that
leaves most of the chip idle still counts as busy. It says whether the GPU waited for work, not
how much of it the work used.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field

QUERY = "utilization.gpu,memory.used"


def _smi(*args: str) -> str:
    """``nvidia-smi``'s output ("" where there is no NVIDIA driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    out = subprocess.run([smi, *args], capture_output=True, text=True,  # noqa: S603 - ours
                         timeout=30, check=False)
    return out.stdout.strip()


def cards() -> list[str]:
    """``nvidia-smi -L``'s lines."""
    return [line.strip() for line in _smi("-L").splitlines() if line.strip()]


def driver() -> str:
    return _smi("--query-gpu=driver_version,name,memory.total", "--format=csv,noheader")


@dataclass
class Sampler:
    """``nvidia-smi`` every ``period_ms``, kept with the time each line arrived."""

    period_ms: int = 200
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # t, util %, MiB
    _proc: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None

    def start(self) -> bool:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return False
        self._proc = subprocess.Popen(  # noqa: S603 - the argv is ours
            [smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
             f"-lms={self.period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return True

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.monotonic(), float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                continue

    def window(self, start: float, end: float) -> dict[str, float] | None:
        """Mean utilisation and peak memory between two ``time.monotonic()`` readings."""
        inside = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not inside:
            return None
        return {"util_pct": round(sum(u for u, _ in inside) / len(inside), 1),
                "memory_mib": max(m for _, m in inside), "samples": len(inside)}

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(5)
