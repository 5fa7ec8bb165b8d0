"""The image recipe, read against the repository (no Docker engine here): the Python of the lock,
the lock's versions, a non-root user, no compiler, ``ferry`` as the entry point."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def stages() -> list[str]:
    return re.split(r"(?m)^FROM ", DOCKERFILE)[1:]


def test_the_python_is_the_locks() -> None:
    image = re.search(r"ARG PYTHON_IMAGE=python:(\d+)\.(\d+)\.(\d+)-slim", DOCKERFILE)
    assert image is not None, "the base image is a slim official Python image"
    lock = (ROOT / "requirements.lock").read_text().splitlines()[0]
    minor = f"{image.group(1)}.{image.group(2)}"
    assert f"Python {minor}" in lock
    assert (int(image.group(1)), int(image.group(2))) == sys.version_info[:2]  # what tests ran
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={minor}"


def test_it_installs_ferry_at_the_locks_versions_in_a_build_stage() -> None:
    build, final = stages()
    assert "AS build" in build.splitlines()[0]
    assert "--constraint requirements.lock ." in build
    for copied in re.findall(r"(?m)^COPY (?!--from)(.+) \S+$", DOCKERFILE):
        for name in copied.split():
            assert (ROOT / name).exists(), name
    assert "COPY --from=build /opt/ferry /opt/ferry" in final


def test_the_final_stage_runs_ferry_as_a_user_without_compilers() -> None:
    final = stages()[-1]
    user = re.search(r"(?m)^USER (\d+)", final)
    assert user is not None and int(user.group(1)) != 0
    assert not re.search(r"gcc|g\+\+|build-essential|apt-get install", final)
    assert 'ENTRYPOINT ["ferry"]' in final and 'CMD ["gateway"]' in final
    assert "FERRY_HOST=0.0.0.0" in final  # listens beyond the pod's loopback


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for name in (".git", ".venv", ".ferry", ".bench", "tests"):
        assert name in ignored
