"""Fixtures that several integration modules share (the servers: ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import TritonServer
from tests.integration.helpers import Served, ferry_served


@pytest.fixture(scope="module")
def ferry(redis_server: str, triton_server: TritonServer,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Ferry as ``ferry up`` runs it, for the module: a gateway (one worker, bodies up to
    64 KiB) and a batcher, on the session's Redis and Triton."""
    with ferry_served(redis_server, triton_server.grpc_url, tmp_path_factory.mktemp("ferry"),
                      max_body_bytes=64 * 1024) as served:
        yield served
