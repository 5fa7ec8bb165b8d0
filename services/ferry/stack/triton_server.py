"""A real Triton Inference Server from the ``nvidia-pytriton`` wheel, on loopback ports.

The wheel ships the ``tritonserver`` binary and the Python backend. Ferry does not use PyTriton's
Python API: the binary serves an ordinary model repository. Two fix-ups make the Python backend
work from a wheel (see shared recipes): its stub must sit beside ``libtriton_python.so`` (Ferry
assembles a private backend directory rather than writing into site-packages), and the stub must
load the running interpreter's own ``libpython`` (first on ``LD_LIBRARY_PATH``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ferry.errors import StartupError
from ferry.stack.ports import LOOPBACK, free_port, http_ok
from ferry.stack.process import ManagedProcess, env_with


@dataclass(frozen=True)
class TritonPorts:
    grpc: int
    http: int
    metrics: int

    @classmethod
    def free(cls) -> TritonPorts:
        return cls(grpc=free_port(), http=free_port(), metrics=free_port())


def pytriton_root() -> Path:
    """The ``pytriton/tritonserver`` folder of the installed wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise StartupError("nvidia-pytriton is not installed; it provides the tritonserver binary")
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def prepare_backends(state_dir: Path) -> Path:
    """Assemble a backend directory whose Python backend has its stub for this interpreter."""
    root = pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise StartupError(f"the Triton wheel has no Python backend stub for Python {version}")
    target = state_dir / "backends" / "python"
    target.mkdir(parents=True, exist_ok=True)
    for source in (*(p for p in (root / "backends" / "python").iterdir() if p.is_file()), stub):
        _replace(source, target / source.name)
    return target.parent


def _replace(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a fresh file renamed over it: a stub still running
    from an earlier Triton (restarted by a test, or by ``ferry up`` again) keeps its old file,
    where copying onto it would fail with "Text file busy"."""
    fresh = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copy2(source, fresh)
    os.replace(fresh, target)


def triton_env() -> dict[str, str]:
    """Environment for tritonserver: this interpreter's libpython and venv come first.

    The copied stub loses its ``$ORIGIN`` rpath, so the wheel's bundled libraries go on the path
    too.
    """
    libdir = str(sysconfig.get_config_var("LIBDIR") or "")
    bundled = str(pytriton_root().parent.parent / "nvidia_pytriton.libs")
    # The child tritonserver's library and program paths, extended from this process's own
    # (not Ferry's settings), when ferry up starts it.
    inherited = os.environ.get("LD_LIBRARY_PATH", "")
    ld_path = os.pathsep.join(p for p in (libdir, bundled, inherited) if p)
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join((bin_dir, os.environ.get("PATH", "")))
    return env_with({"LD_LIBRARY_PATH": ld_path, "PATH": path})


def triton_argv(model_repository: Path, backends: Path, ports: TritonPorts) -> list[str]:
    return [
        str(pytriton_root() / "bin" / "tritonserver"),
        f"--model-repository={model_repository}",
        f"--backend-directory={backends}",
        f"--grpc-address={LOOPBACK}", f"--grpc-port={ports.grpc}",
        f"--http-address={LOOPBACK}", f"--http-port={ports.http}",
        f"--metrics-address={LOOPBACK}", f"--metrics-port={ports.metrics}",
        "--allow-cpu-metrics=false", "--allow-gpu-metrics=false",
        "--strict-readiness=true", "--exit-on-error=true", "--log-verbose=0",
        "--exit-timeout-secs=5",  # on SIGTERM, in-flight inferences get 5 s, not Triton's 30
    ]


def http_ready(http_port: int) -> bool:
    """Whether Triton's ``/v2/health/ready`` answers 200 (all models loaded)."""
    return http_ok(f"http://{LOOPBACK}:{http_port}/v2/health/ready", timeout_s=1.0)


def start_triton(
    model_repository: Path,
    state_dir: Path,
    *,
    ports: TritonPorts | None = None,
    timeout_s: float = 180.0,
    interrupted: Callable[[], bool] = lambda: False,
    extra_args: Sequence[str] = (),
) -> tuple[ManagedProcess, TritonPorts]:
    """Start tritonserver on ``model_repository`` and wait until every model is ready;
    ``extra_args`` go to tritonserver as they are (``--grpc-use-ssl=true``...)."""
    if not (model_repository / "").is_dir():
        raise StartupError(f"model repository {model_repository} is not a directory")
    ports = ports or TritonPorts.free()
    backends = prepare_backends(state_dir)
    proc = ManagedProcess(
        "tritonserver", [*triton_argv(model_repository, backends, ports), *extra_args],
        env=triton_env(), log_path=state_dir / "triton.log",
    )
    proc.start()
    try:
        proc.wait_ready(lambda: http_ready(ports.http), timeout_s, interrupted)
    except StartupError:
        proc.stop(grace_s=10)
        raise
    return proc, ports
