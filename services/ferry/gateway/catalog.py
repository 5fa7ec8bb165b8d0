"""Which models the gateway accepts requests for, and what Triton says of each (its
metadata), from Triton, cached for a few seconds and refreshed in the background."""

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
from ferry.kept import Kept, retrieved
from ferry.oip.spec import ModelInterface
from ferry.triton.base import InferenceBackend, ModelSpec, default_version


class ModelCatalog:
    """Ready models by name (a stale list is used while Triton cannot be asked), and each
    model's metadata by version (a refusal is not kept: the next request asks again)."""

    def __init__(self, backend: InferenceBackend, refresh_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 on_names: Callable[[list[str]], None] = lambda names: None) -> None:
        self.backend = backend
        self.on_names = on_names  # told each list of ready models as it is read
        self.refresh_s = refresh_s
        self.clock = clock
        self._names: list[str] | None = None
        self._fetched_at = -float("inf")
        self._lock = asyncio.Lock()
        self._listing: asyncio.Task[None] | None = None  # a refresh of the list in the background
        # by (model, version): kept refresh_s, refreshed in the background (ferry.kept)
        self._metadata: Kept[tuple[str, str], dict[str, Any]] = Kept(refresh_s, clock)
        self._interfaces: Kept[tuple[str, str], ModelInterface] = Kept(refresh_s, clock)
        self._defaults: Kept[tuple[str, str], str] = Kept(refresh_s, clock)

    async def names(self, wanted: str = "") -> list[str]:
        """The ready models. Past ``refresh_s`` the list kept answers while one refresh runs in
        the background, unless ``wanted`` is not on it: that request waits for the refresh, so
        that a model loaded since is found at once."""
        if self._names is not None:
            if self.clock() - self._fetched_at < self.refresh_s:
                return self._names
            if not wanted or wanted in self._names:
                if self._listing is None or self._listing.done():
                    self._listing = asyncio.get_running_loop().create_task(self._refresh_once())
                    self._listing.add_done_callback(retrieved)
                return self._names
        await self._refresh_once()
        assert self._names is not None
        return self._names

    async def _refresh_once(self) -> None:
        async with self._lock:
            if self.clock() - self._fetched_at >= self.refresh_s or self._names is None:
                await self._refresh()

    async def _refresh(self) -> None:
        try:
            self._names = await self.backend.ready_models()
            self._fetched_at = self.clock()
            self.on_names(self._names)
        except BackendError as exc:
            if self._names is None:
                raise DependencyUnavailableError(f"cannot list Triton's models: {exc}") from exc

    async def resolve(self, name: str) -> ModelSpec:
        """The spec of a ready model, or a 4xx naming the problem."""
        _require_ready(name, await self.names(name))
        try:
            return await self.backend.model_spec(name)
        except BackendError as exc:
            raise _refusal(name, exc) from exc

    async def tensor_interface(self, name: str, version: str = "") -> ModelInterface:
        """The tensors of a ready model (that version), or a 4xx naming the problem, as
        ``/v1`` answers it (a stateful or decoupled model is ``unsupported_model``)."""
        _require_ready(name, await self.names(name))
        try:
            return await self.interface(name, version)
        except BackendError as exc:
            raise _refusal(name, exc) from exc

    async def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        """Triton's metadata of the model (that version), refreshed past ``refresh_s``."""
        return await self._metadata.get((model, version),
                                        lambda: self.backend.model_metadata(model, version))

    async def interface(self, model: str, version: str = "") -> ModelInterface:
        """The model's tensors (that version), from its metadata and config, refreshed past
        ``refresh_s``; a model a queue cannot serve raises ``UnsupportedModelError``."""
        async def fetch() -> ModelInterface:
            metadata = await self.metadata(model, version)
            config = await self.backend.model_config(model, version)
            return ModelInterface.from_triton(metadata, config)

        return await self._interfaces.get((model, version), fetch)

    async def default_version(self, model: str) -> str:
        """The version a request of ``model`` that pins none goes to when no rollout picks
        ('': Triton's policy), from its config's ``ferry_default_version``; '' when Triton
        cannot say (the request then fails or succeeds as Triton's policy would have it)."""
        async def fetch() -> str:
            try:
                return default_version(await self.backend.model_config(model))
            except BackendError:
                return ""

        return await self._defaults.get((model, ""), fetch)


def _require_ready(name: str, names: list[str]) -> None:
    if name not in names:
        known = ", ".join(names) or "none"
        raise NotFoundError("unknown_model", f"unknown model {name!r}; ready models: {known}")


def _refusal(name: str, error: BackendError) -> Exception:
    """Triton's answer about a model as ``/v1``'s refusal: a model that does not follow the
    contract (422), an unknown model or version (404), Triton unreachable (503)."""
    if isinstance(error, ModelContractError):
        return UnprocessableError("unsupported_model", str(error))
    if isinstance(error, UnknownModelError):  # Triton's words name the model and version
        return NotFoundError("unknown_model", error.reason)
    return DependencyUnavailableError(f"cannot read model {name!r}: {error}")
