"""``/v1/admin/rollouts``: the rollouts' admin API, guarded by its own bearer token
(``admin_token``), apart from the clients' credentials: reading and changing a model's rollout,
promoting or rolling back its candidate, its figures, decisions and shadow comparison. Every
change is a new generation of the rollout in Redis, logged with who made it; every gateway
serves it within a second (``gateway.versions``)."""

from __future__ import annotations

import dataclasses
import hmac
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi import Path as FastApiPath
from fastapi.responses import JSONResponse

from ferry.errors import (
    BackendError,
    BadRequestError,
    ClientError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    UnauthorizedError,
)
from ferry.gateway.catalog import ModelCatalog
from ferry.gateway.query import checked_query
from ferry.gateway.usage_routes import add_usage_route
from ferry.gateway.versions import Versions
from ferry.rollouts.rollout import TRIAL, Rollout, amended, declared
from ferry.rollouts.store import RolloutStore
from ferry.usage.store import LedgerReader

MODEL = FastApiPath(min_length=1, description="the model's name, as Triton knows it")
WINDOWS_S = (60, 600)  # besides "since the share last changed"
Work = Callable[[], Awaitable[Any]]
DOCUMENTED = (400, 401, 403, 404, 409)


class AdminToken:
    """The admin API's own bearer token (``admin_token``), apart from the clients' credentials:
    every admin route checks it before it does anything."""

    def __init__(self, token: str) -> None:
        self.token = token

    def check(self, authorization: str | None) -> None:
        """A 403 while the admin API is off, a 401 without the admin token."""
        if not self.token:
            raise ForbiddenError("admin_disabled", "the admin API is off: set FERRY_ADMIN_TOKEN "
                                 "(admin_token) on the gateways")
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(),
                                                                 self.token.encode()):
            raise UnauthorizedError("invalid_admin_token", "send the admin token as "
                                    "'Authorization: Bearer <admin_token>'")


class RolloutAdmin:
    """The operations behind the routes."""

    def __init__(self, store: RolloutStore, versions: Versions, catalog: ModelCatalog) -> None:
        self.store = store
        self.versions = versions  # this gateway's picks, forgotten at a change
        self.catalog = catalog

    async def listing(self) -> dict[str, Any]:
        rollouts = await self.store.all()
        return {"rollouts": [r.to_json() for _, r in sorted(rollouts.items())]}

    async def status(self, model: str) -> dict[str, Any]:
        """The rollout, each version's figures over windows, the guard's last look, and the
        latest decisions."""
        rollout = await self._rollout(model)
        now = time.time()
        windows: dict[str, dict[str, Any]] = {}
        for version in dict.fromkeys(v for v in (rollout.stable, rollout.candidate) if v):
            windows[version] = {
                "since_change": (await self.store.figures(model, version, rollout.since,
                                                          now)).to_json(),
                **{f"last_{w}s": (await self.store.figures(model, version, now - w,
                                                           now)).to_json() for w in WINDOWS_S}}
        return {"rollout": rollout.to_json(), "figures": windows,
                "guard": await self.store.last_check(model),
                "decisions": await self.store.log(model, 10)}

    async def put(self, model: str, body: bytes) -> dict[str, Any]:
        """Declare the model's rollout (fields not sent keep their defaults)."""
        now = time.time()
        after = declared(model, _object(body), now)
        await self._known_versions(model, after)
        before = await self.store.get(model)
        return await self._change(before, _next(before, after, now), "set",
                                  "set through the admin API")

    async def patch(self, model: str, body: bytes) -> dict[str, Any]:
        """Change the fields sent; the others keep their values (``rollout.amended``)."""
        doc = _object(body)
        now = time.time()
        before = await self.store.get(model)
        after = amended(before, doc, now, model)
        if before is None or any(name in doc for name in TRIAL):  # versions it names anew
            await self._known_versions(model, after)
        return await self._change(before, _next(before, after, now), "set",
                                  f"changed through the admin API: {', '.join(sorted(doc))}")

    async def promote(self, model: str) -> dict[str, Any]:
        rollout = await self._live(model)
        return await self._change(rollout, rollout.promoted(time.time()), "promote",
                                  "promoted through the admin API")

    async def rollback(self, model: str) -> dict[str, Any]:
        rollout = await self._live(model)
        return await self._change(rollout, rollout.rolled_back(time.time()), "rollback",
                                  "rolled back through the admin API")

    async def delete(self, model: str) -> dict[str, Any]:
        await self._rollout(model)
        await self.store.remove(model, {"at": time.time(), "action": "delete", "by": "admin",
                                        "reason": "deleted through the admin API"})
        self.versions.forget()
        return {"model": model, "deleted": True}

    async def compare(self, model: str, candidate: str) -> dict[str, Any]:
        rollout = await self._rollout(model)
        version = candidate or rollout.candidate or (rollout.previous and rollout.stable)
        if not version:
            raise NotFoundError("no_candidate", f"model {model!r}'s rollout has no candidate; "
                                "name one with ?candidate=")
        report = await self.store.comparison(model, version)
        return {"model": model, "stable": rollout.stable, "candidate": version, **report}

    async def decisions(self, model: str, limit: int) -> dict[str, Any]:
        await self._rollout(model)
        return {"model": model, "decisions": await self.store.log(model, limit)}

    async def _change(self, before: Rollout | None, after: Rollout, action: str,
                      reason: str) -> dict[str, Any]:
        entry = {"at": after.updated_at, "action": action, "by": "admin", "reason": reason,
                 "share_from": before.share if before else 0.0, "share": after.share,
                 "stable": after.stable, "candidate": after.candidate}
        if not await self.store.change(before, after, entry):
            raise ConflictError("rollout_changed", f"model {after.model!r}'s rollout changed "
                                "meanwhile (the guard or another admin); read it and try again")
        self.versions.forget()
        return after.to_json()

    async def _rollout(self, model: str) -> Rollout:
        rollout = await self.store.get(model)
        if rollout is None:
            raise NotFoundError("unknown_rollout", f"model {model!r} has no rollout")
        return rollout

    async def _live(self, model: str) -> Rollout:
        rollout = await self._rollout(model)
        if not rollout.live:
            raise ConflictError("no_candidate", f"model {model!r} has no candidate being tried "
                                f"(its rollout is {rollout.state})")
        return rollout

    async def _known_versions(self, model: str, rollout: Rollout) -> None:
        """A 404 for a version Triton does not have ready."""
        for version in (rollout.stable, rollout.candidate):
            if version:
                try:
                    await self.catalog.metadata(model, version)
                except BackendError as exc:
                    raise NotFoundError("unknown_model_version", f"model {model!r} has no "
                                        f"version {version} ready: {exc}") from None


Route = tuple[str, str, str, Callable[[Request, str], Awaitable[Any]], frozenset[str]]
NONE: frozenset[str] = frozenset()  # a route that takes no query parameters


def add_admin_routes(api: FastAPI, admin: RolloutAdmin, token: AdminToken,
                     ledger: LedgerReader) -> None:
    """The rollouts' routes under ``/v1/admin/rollouts``, and ``/v1/admin/usage``
    (``gateway.usage_routes``, reading ``ledger``), behind the same token."""
    for route in _rollout_routes(admin):
        _add_route(api, token, route)
    add_usage_route(api, token.check, ledger)


def _rollout_routes(admin: RolloutAdmin) -> list[Route]:
    """Each rollout route: its method, its path under the base, its summary, its work and the
    query parameters it takes."""
    return [
        ("GET", "", "List every rollout", lambda r, m: admin.listing(), NONE),
        ("GET", "/{model}", "Status: the rollout, per-version figures, the guard's last look",
         lambda r, m: admin.status(m), NONE),
        ("PUT", "/{model}", "Set the rollout (JSON: stable, candidate, share, shadow, ...)",
         lambda r, m: _put(admin, r, m), NONE),
        ("PATCH", "/{model}", "Change the fields sent, keep the others (ferry rollout set)",
         lambda r, m: _patch(admin, r, m), NONE),
        ("DELETE", "/{model}", "Delete the rollout", lambda r, m: admin.delete(m), NONE),
        ("POST", "/{model}/promote", "Promote the candidate", lambda r, m: admin.promote(m),
         NONE),
        ("POST", "/{model}/rollback", "Rollback the candidate", lambda r, m: admin.rollback(m),
         NONE),
        ("GET", "/{model}/compare", "Compare shadow answers with the primary's",
         lambda r, m: admin.compare(m, r.query_params.get("candidate", "")),
         frozenset({"candidate"})),
        ("GET", "/{model}/decisions", "Decisions, newest first (limit)",
         lambda r, m: admin.decisions(m, _limit(r.query_params.get("limit"))),
         frozenset({"limit"})),
    ]


def _add_route(api: FastAPI, token: AdminToken, route: Route) -> None:
    method, under, summary, work, takes = route
    path = f"/v1/admin/rollouts{under}"
    named = f"{method} {path}"  # how a refusal of its query names it

    async def of_model(request: Request, model: str = MODEL) -> Response:
        return await _answer(token, request, lambda: work(request, model), takes, named)

    async def of_all(request: Request) -> Response:
        return await _answer(token, request, lambda: work(request, ""), takes, named)

    tags: list[str | Enum] = ["Admin: rollouts"]
    api.add_api_route(path, of_model if "{model}" in path else of_all, methods=[method],
                      tags=tags, summary=summary, responses=_documented(),
                      operation_id=f"admin_{summary.split(maxsplit=1)[0].lower()}_"
                                   f"{method.lower()}")


async def _put(admin: RolloutAdmin, request: Request, model: str) -> dict[str, Any]:
    return await admin.put(model, await request.body())


async def _patch(admin: RolloutAdmin, request: Request, model: str) -> dict[str, Any]:
    return await admin.patch(model, await request.body())


def _next(before: Rollout | None, after: Rollout, now: float) -> Rollout:
    """``after`` as the next generation of the stored ``before`` (None: the first)."""
    if before is not None:
        after = dataclasses.replace(after, generation=before.generation)
    return after.changed(now)


def _object(body: bytes) -> dict[str, Any]:
    """A request's JSON object, or a 400."""
    try:
        doc = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequestError("malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequestError("malformed_json", "the body must be a JSON object")
    return doc


def _limit(raw: str | None) -> int:
    if raw is None:
        return 50
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise BadRequestError("invalid_parameter", "limit must be a number from 1 to 1000")
    return int(raw)


async def _answer(token: AdminToken, request: Request, work: Work,
                  takes: frozenset[str] = frozenset(), route: str = "") -> Response:
    try:
        token.check(request.headers.get("authorization"))
        checked_query(request.query_params.multi_items(), takes, route)
        return JSONResponse(await work())
    except ClientError as exc:
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, exc.status)


def _documented() -> dict[int | str, dict[str, Any]]:
    error = {"content": {"application/json": {"schema": {"type": "object"}}}}
    answers: dict[int | str, dict[str, Any]] = {200: {"description": "the answer", **error}}
    for status in DOCUMENTED:
        answers[status] = {"description": "an error, with its code and message", **error}
    return answers
