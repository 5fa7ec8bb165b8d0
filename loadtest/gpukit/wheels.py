"""Which of Ferry's dependencies the kit carries to the GPU machine, pinned to this venv's versions.

Everything Ferry needs at run time (its requirements and theirs, read from the installed
metadata), less what the GPU machine's image already has (the device tool's KINDS.md lists it):
what is there is used as it is, so the kit stays under its 64 MiB. grpcio and protobuf travel
anyway: Ferry's generated gRPC code checks the runtime's version against its own. numpy stays
the machine's (2.x: PyTorch there is built against it, and Ferry runs on it).

``python -m loadtest.gpukit.wheels`` prints the requirements, one ``name==version`` a line.
"""

from __future__ import annotations

import re
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = "ferry"
# Extras Ferry's own requirements ask for, where they matter at run time.
EXTRAS = {"uvicorn": {"standard"}, "tritonclient": {"grpc"}, "pyjwt": {"crypto"}}
# On the GPU machine's image (KINDS.md, 2026-11-17), by normalised name.
PRESENT = frozenset({
    "absl-py", "aiohappyeyeballs", "aiohttp", "aiosignal", "anyio", "attrs", "certifi",
    "charset-normalizer", "click", "filelock", "frozenlist", "fsspec", "h11", "httpcore", "httpx",
    "idna", "jinja2", "markupsafe", "ml-dtypes", "multidict", "numpy", "packaging", "pillow",
    "prometheus-client", "propcache", "psutil", "pygments", "python-dateutil", "pyyaml",
    "requests", "six", "sympy", "typing-extensions", "urllib3", "uvloop", "wrapt", "yarl", "zipp",
})
ALWAYS = frozenset({"grpcio", "protobuf"})  # version-checked by generated code
# Never at run time on that machine: the test tools' and other backends' packages.
# kubernetes: only a batcher that follows a StatefulSet imports it, and the kit's do not.
SKIP = frozenset({"nvidia-pytriton", "nudenet", "onnxruntime", "gevent", "geventhttpclient",
                  "aiohttp-retry", "kubernetes"})


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str = ROOT) -> dict[str, str]:
    """Every distribution ``root`` needs at run time on Linux with Python 3.12: name → version."""
    env: dict[str, str] = {**{k: str(v) for k, v in default_environment().items()},
                           "python_version": "3.12",
                           "python_full_version": "3.12.3", "sys_platform": "linux",
                           "platform_system": "Linux"}
    found: dict[str, str] = {}
    todo = [(root, frozenset[str]())]
    while todo:
        name, extras = todo.pop()
        dist = metadata.distribution(name)
        key = normalise(dist.metadata["Name"])
        if key in found and not extras:
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = [{**env, "extra": e} for e in (extras or {""})]
            if req.marker is not None and not any(req.marker.evaluate(w) for w in wanted):
                continue
            child = normalise(req.name)
            if child in SKIP or (child in found and not req.extras):
                continue
            todo.append((child, frozenset(req.extras | EXTRAS.get(child, set()))))
    found.pop(normalise(root), None)
    return found


def carried(needed: dict[str, str]) -> dict[str, str]:
    """What travels: needed, less what the machine has (but grpcio and protobuf)."""
    return {name: version for name, version in sorted(needed.items())
            if name in ALWAYS or name not in PRESENT}


def main() -> None:
    for name, version in carried(closure()).items():
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
