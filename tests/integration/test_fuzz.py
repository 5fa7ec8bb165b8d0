"""Schemathesis against the gateway's own OpenAPI, with authentication off and on: no 5xx, and
every answer (error bodies included) matches the documented status codes, headers and schemas.

The runs are bounded (examples per operation, a time budget) and seeded, so that CI repeats
them; ``FERRY_FUZZ_EXAMPLES`` raises the count for a longer hunt."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.stack.ports import free_port
from tests.conftest import TritonServer
from tests.integration.helpers import batcher_settings, ferry_processes, gateway_settings
from tests.integration.test_security import ALICE_KEY, KEYS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

EXAMPLES = int(os.environ.get("FERRY_FUZZ_EXAMPLES", "30"))
ADMIN_TOKEN = "fuzz-admin-token-0123456789"
# Checks that do not apply to this API, each for a reason:
# - use_after_free / ensure_resource_availability: DELETE cancels a task, it does not delete it;
#   its record stays readable (CANCELLED) on purpose.
# - positive_data_acceptance: input that fits the schema may still be refused with a documented
#   4xx (an unknown model name, text that is not an image for an image model, a busy backlog).
EXCLUDED = "use_after_free,ensure_resource_availability,positive_data_acceptance"


@pytest.fixture
def stack_processes(redis_url: str, triton_server: TritonServer, tmp_path: Path,
                    request: pytest.FixtureRequest) -> Iterator[str]:
    auth: dict[str, object] = request.param
    gateway = gateway_settings(redis_url, triton_server.grpc_url, port=free_port(), workers=1,
                               max_poll_s=1.0, **auth)
    batcher = batcher_settings(redis_url, triton_server.grpc_url)
    with ferry_processes(gateway, batcher, tmp_path) as url:
        yield url


def schemathesis(url: str, report: Path, *headers: str, max_time_s: int = 25
                 ) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("st")), "run", f"{url}/openapi.json",
               "--checks", "all", "--exclude-checks", EXCLUDED, "-n", str(EXAMPLES),
               "--seed", "20261122", "--max-time", str(max_time_s), "--request-timeout", "10",
               "--generation-database", "none", "--no-color",
               "--report", "junit", "--report-junit-path", str(report)]
    for header in headers:
        command += ["-H", header]
    root = str(Path(__file__).resolve().parents[2])  # where the hooks module is found
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, capture_output=True, text=True, timeout=400, check=False,
                          env=env, cwd=report.parent)  # its cache goes there, not in the tree


@pytest.mark.parametrize("stack_processes", [{"admin_token": ADMIN_TOKEN}], indirect=True,
                         ids=["auth-off"])
def test_fuzz_without_authentication(stack_processes: str, tmp_path: Path) -> None:
    """With the admin token too: the rollouts' admin API is fuzzed past its guard."""
    run = schemathesis(stack_processes, tmp_path / "junit.xml",
                       f"Authorization: Bearer {ADMIN_TOKEN}")
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]


@pytest.mark.parametrize("stack_processes", [{"auth": "api_key", "api_keys": KEYS,
                                              "rate_limit_per_min": 0}],
                         indirect=True, ids=["api-key"])
def test_fuzz_with_an_api_key(stack_processes: str, tmp_path: Path) -> None:
    """The same schema behind a key: a shorter run (the other covers the routes' inputs)."""
    run = schemathesis(stack_processes, tmp_path / "junit.xml", f"X-API-Key: {ALICE_KEY}",
                       max_time_s=12)
    print(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
