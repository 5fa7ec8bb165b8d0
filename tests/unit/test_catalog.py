"""The gateway's model catalog (``ferry.gateway.catalog``): what it keeps, when it asks Triton
again, and that concurrent requests share one fetch. The backend here is a stand-in that counts
and holds its answers: the catalog's caching is the logic under test, not Triton's replies
(the integration tests ask a real tritonserver through it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ferry.errors import (
    BackendError,
    DependencyUnavailableError,
    NotFoundError,
    UnknownModelError,
)
from ferry.gateway.catalog import ModelCatalog
from ferry.kept import Kept

REFRESH_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """Answers what it is set to, each answer held until ``gate`` is set; counts the asks."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.models = ["m"]
        self.versions: dict[str, str] = {"m": "1"}
        self.refuse: Exception | None = None
        self.asked: dict[str, int] = {"ready_models": 0, "model_metadata": 0, "model_config": 0}

    async def _answer(self, what: str) -> None:
        self.asked[what] += 1
        await self.gate.wait()
        if self.refuse is not None:
            raise self.refuse

    async def ready_models(self) -> list[str]:
        await self._answer("ready_models")
        return list(self.models)

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        await self._answer("model_metadata")
        return {"name": model, "versions": [self.versions[model]]}

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        await self._answer("model_config")
        return {"name": model, "parameters": {
            "ferry_default_version": {"string_value": self.versions[model]}}}


Parts = tuple[ModelCatalog, "Backend", "Clock"]


@pytest.fixture
def parts() -> Parts:
    backend, clock = Backend(), Clock()
    return ModelCatalog(backend, REFRESH_S, clock=clock), backend, clock  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_requests_for_a_key_not_kept_share_one_fetch(parts: Parts) -> None:
    catalog, backend, _ = parts
    backend.gate.clear()
    waiting = [asyncio.ensure_future(catalog.metadata("m")) for _ in range(50)]
    await settle()
    assert backend.asked["model_metadata"] == 1
    backend.gate.set()
    answers = await asyncio.gather(*waiting)
    assert all(a == {"name": "m", "versions": ["1"]} for a in answers)
    assert backend.asked["model_metadata"] == 1


async def test_past_the_refresh_a_request_is_answered_from_what_is_kept_while_one_fetch_runs(
        parts: Parts) -> None:
    catalog, backend, clock = parts
    assert await catalog.default_version("m") == "1"
    backend.versions["m"] = "2"
    clock.now += REFRESH_S
    backend.gate.clear()  # Triton slow to answer: nobody waits for it
    answers = [await asyncio.wait_for(catalog.default_version("m"), 1) for _ in range(20)]
    assert answers == ["1"] * 20
    assert backend.asked["model_config"] == 2  # the first fetch and one refresh, not 21
    backend.gate.set()
    await settle()
    assert await catalog.default_version("m") == "2"
    assert backend.asked["model_config"] == 2


async def test_within_the_refresh_nothing_is_asked_again(parts: Parts) -> None:
    catalog, backend, clock = parts
    await catalog.metadata("m")
    clock.now += REFRESH_S - 0.1
    await catalog.metadata("m")
    await settle()
    assert backend.asked["model_metadata"] == 1


async def test_a_refusal_is_not_kept(parts: Parts) -> None:
    catalog, backend, _ = parts
    backend.refuse = UnknownModelError("unknown model 'm'")
    for _ in range(2):
        with pytest.raises(UnknownModelError):
            await catalog.metadata("m")
    assert backend.asked["model_metadata"] == 2
    backend.refuse = None
    assert await catalog.metadata("m") == {"name": "m", "versions": ["1"]}


async def test_a_refused_refresh_drops_what_was_kept(parts: Parts) -> None:
    catalog, backend, clock = parts
    await catalog.metadata("m")
    clock.now += REFRESH_S
    backend.refuse = UnknownModelError("unknown model 'm'")
    assert await catalog.metadata("m") == {"name": "m", "versions": ["1"]}  # the refresh starts
    await settle()  # ... and is refused
    with pytest.raises(UnknownModelError):
        await catalog.metadata("m")


async def test_a_request_that_gives_up_leaves_the_shared_fetch_to_the_others(parts: Parts) -> None:
    catalog, backend, _ = parts
    backend.gate.clear()
    leaving = asyncio.ensure_future(catalog.metadata("m"))
    staying = asyncio.ensure_future(catalog.metadata("m"))
    await settle()
    leaving.cancel()
    await settle()
    backend.gate.set()
    assert await staying == {"name": "m", "versions": ["1"]}
    assert backend.asked["model_metadata"] == 1


async def test_the_list_of_models_is_refreshed_in_the_background(parts: Parts) -> None:
    catalog, backend, clock = parts
    assert await catalog.names() == ["m"]
    clock.now += REFRESH_S
    backend.models = ["m", "n"]
    backend.gate.clear()
    assert await asyncio.wait_for(catalog.names("m"), 1) == ["m"]  # kept; one refresh started
    assert await asyncio.wait_for(catalog.names(), 1) == ["m"]
    assert backend.asked["ready_models"] == 2
    backend.gate.set()
    await settle()
    assert await catalog.names() == ["m", "n"]


async def test_a_model_not_on_the_kept_list_waits_for_the_refresh(parts: Parts) -> None:
    catalog, backend, clock = parts
    await catalog.names()
    backend.models = ["m", "new"]
    clock.now += REFRESH_S
    assert await catalog.names("new") == ["m", "new"]  # loaded since: found at once
    with pytest.raises(NotFoundError):
        await catalog.resolve("gone")


async def test_the_list_kept_answers_while_triton_cannot_be_asked(parts: Parts) -> None:
    catalog, backend, clock = parts
    await catalog.names()
    clock.now += REFRESH_S
    backend.refuse = BackendError("connection refused")
    assert await catalog.names("m") == ["m"]
    await settle()
    assert await catalog.names("m") == ["m"]


async def test_no_list_ever_read_is_an_error_naming_triton() -> None:
    backend = Backend()
    backend.refuse = BackendError("connection refused")
    catalog = ModelCatalog(backend, REFRESH_S)  # type: ignore[arg-type]
    with pytest.raises(DependencyUnavailableError, match="cannot list Triton's models"):
        await catalog.names("m")


# -- ferry.kept, under the catalog and the Triton pool's specs ---------------------------------

async def test_fresh_fetches_anew_and_waits_for_it() -> None:
    clock, asked = Clock(), []

    async def fetch() -> int:
        asked.append(1)
        return len(asked)

    kept: Kept[str, int] = Kept(REFRESH_S, clock)
    assert await kept.get("k", fetch) == 1
    assert await kept.get("k", fetch) == 1
    assert await kept.get("k", fetch, fresh=True) == 2
    kept.drop("k")
    assert kept.peek("k") is None
    assert await kept.get("k", fetch) == 3


async def test_past_its_limit_what_is_kept_is_dropped() -> None:
    kept: Kept[int, int] = Kept(REFRESH_S, Clock(), limit=3)

    for n in range(4):
        async def fetch(n: int = n) -> int:
            return n

        await kept.get(n, fetch)
    assert [kept.peek(n) for n in range(4)] == [None, None, None, 3]
