"""Which models the gateway accepts requests for, and what Triton says of each (its
metadata), from Triton, cached for a few seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ferry.errors import (
    BackendError,
    DependencyUnavailableError,
    ModelContractError,
    NotFoundError,
    UnknownModelError,
    UnprocessableError,
)
from ferry.triton.base import InferenceBackend, ModelSpec

METADATA_KEPT = 1024  # (model, version) pairs whose metadata is kept; any name may be asked for


class ModelCatalog:
    """Ready models by name (a stale list is used while Triton cannot be asked), and each
    model's metadata by version (a refusal is not kept: the next request asks again)."""

    def __init__(self, backend: InferenceBackend, refresh_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.refresh_s = refresh_s
        self.clock = clock
        self._names: list[str] | None = None
        self._fetched_at = -float("inf")
        self._lock = asyncio.Lock()
        self._metadata: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}

    async def names(self) -> list[str]:
        if self.clock() - self._fetched_at < self.refresh_s and self._names is not None:
            return self._names
        async with self._lock:
            if self.clock() - self._fetched_at >= self.refresh_s or self._names is None:
                await self._refresh()
        assert self._names is not None
        return self._names

    async def _refresh(self) -> None:
        try:
            self._names = await self.backend.ready_models()
            self._fetched_at = self.clock()
        except BackendError as exc:
            if self._names is None:
                raise DependencyUnavailableError(f"cannot list Triton's models: {exc}") from exc

    async def resolve(self, name: str) -> ModelSpec:
        """The spec of a ready model, or a 4xx naming the problem."""
        names = await self.names()
        if name not in names:
            known = ", ".join(names) or "none"
            raise NotFoundError("unknown_model", f"unknown model {name!r}; ready models: {known}")
        try:
            return await self.backend.model_spec(name)
        except ModelContractError as exc:
            raise UnprocessableError("unsupported_model", str(exc)) from exc
        except UnknownModelError as exc:
            raise NotFoundError("unknown_model", str(exc)) from exc
        except BackendError as exc:
            raise DependencyUnavailableError(f"cannot read model {name!r}: {exc}") from exc

    async def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        """Triton's metadata of the model (that version), at most ``refresh_s`` old."""
        key = (model, version)
        kept = self._metadata.get(key)
        if kept is not None and self.clock() - kept[0] < self.refresh_s:
            return kept[1]
        fetched = await self.backend.model_metadata(model, version)
        if len(self._metadata) >= METADATA_KEPT:
            self._metadata.clear()
        self._metadata[key] = (self.clock(), fetched)
        return fetched
