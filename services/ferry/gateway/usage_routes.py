"""``GET /v1/admin/usage``: what each client cost (the usage ledger, ``ferry.usage``), behind
the admin token like the rollouts' routes (``gateway.admin``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from fastapi import FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse

from ferry import keys
from ferry.errors import ClientError
from ferry.gateway.query import checked_query
from ferry.usage import ledger
from ferry.usage.store import LedgerReader

PATH = "/v1/admin/usage"
DEFAULT_SINCE_S = 86400
SINCE = Query(None, description="how far back: a number and a unit (s, m, h, d), e.g. '24h' "
              "(default), '7d'; counted in whole hours (UTC), the first from its start; at "
              "most the ledger's retention (35d)")
MODEL = Query(None, description="only this model's usage")
TAKES = frozenset({"since", "model"})


def add_usage_route(api: FastAPI, check: Callable[[str | None], None],
                    reader: LedgerReader) -> None:
    """The route; ``check`` refuses a request without the admin token (a ``ClientError``)."""

    async def usage(request: Request, since: str | None = SINCE,
                    model: str | None = MODEL) -> Response:
        try:
            check(request.headers.get("authorization"))
            checked_query(request.query_params.multi_items(), TAKES, f"GET {PATH}")
            since_s = ledger.parse_since(since, DEFAULT_SINCE_S, keys.LEDGER_TTL_S)
            now = time.time()
            rows = await reader.usage(since_s, model or "", now)
            return JSONResponse(ledger.report(rows, since_s, now, model or ""))
        except ClientError as exc:
            return JSONResponse({"error": {"code": exc.code, "message": exc.message}},
                                exc.status)

    tags: list[str | Enum] = ["Admin: usage"]
    api.add_api_route(PATH, usage, methods=["GET"], tags=tags, operation_id="admin_usage_get",
                      summary="What each client cost: tasks, rows and GPU seconds per client and "
                      "model, the most GPU time first", responses=_documented())


def _documented() -> dict[int | str, dict[str, Any]]:
    error = {"content": {"application/json": {"schema": {"type": "object"}}}}
    return {200: {"description": "the usage rows and their totals", **error},
            400: {"description": "since is not a window", **error},
            401: {"description": "no admin token", **error},
            403: {"description": "the admin API is off", **error}}
