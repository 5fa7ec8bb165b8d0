"""How many batcher replicas share the partitions: fixed by configuration, or the replica count
of their StatefulSet, read through the Kubernetes API (in-cluster service account)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ReplicaCount(Protocol):
    async def __call__(self) -> int:
        ...


class FixedReplicas:
    def __init__(self, count: int) -> None:
        self.count = count

    async def __call__(self) -> int:
        return self.count


def pod_namespace(path: Path = NAMESPACE_FILE) -> str:
    """The namespace this pod runs in (its service account's), or ``default``."""
    try:
        return path.read_text().strip() or "default"
    except OSError:
        return "default"


class StatefulSetReplicas:
    """``spec.replicas`` of a StatefulSet: the count the batchers are being scaled to (a pod
    being removed owns nothing from the moment the count drops)."""

    def __init__(self, name: str, namespace: str | None = None, api: Any = None) -> None:
        self.name = name
        self.namespace = namespace or pod_namespace()
        self._api = api

    async def __call__(self) -> int:
        return await asyncio.to_thread(self._read)

    def _read(self) -> int:
        if self._api is None:
            # The Kubernetes client (a large package) is imported only by a batcher that
            # follows a StatefulSet: fixed partitions never need it.
            from kubernetes import client, config  # noqa: PLC0415

            load_incluster: Callable[[], None] = config.load_incluster_config  # untyped there
            load_incluster()
            self._api = client.AppsV1Api()
        found = self._api.read_namespaced_stateful_set(self.name, self.namespace)
        return int(found.spec.replicas or 0)
