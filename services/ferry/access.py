"""Who may use the hot routes: the caller's credential, its rate limit, what it may hold.

``FERRY_AUTH=none`` (the default of ``make up``) lets everyone in as no one in particular: tasks
then have no owner and no per-client limit applies. With ``api_key`` or ``jwt`` every request of
the hot routes is authenticated (401 otherwise), counted against its client's rate in Redis
(429 past it), and its tasks belong to its client.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ferry.auth.api_keys import ApiKeyAuthenticator
from ferry.auth.base import Authenticator, Credential
from ferry.auth.jwt import JwtAuthenticator
from ferry.auth.rate_limit import Rate, RateLimiter
from ferry.errors import ForbiddenError, TooManyRequestsError, UnauthorizedError
from ferry.resp.client import Commands
from ferry.settings import GatewaySettings
from ferry.tasks.base import NO_OWNER, Owner

log = logging.getLogger(__name__)
Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Caller:
    """Who is asking: ``client_id`` None when authentication is off; the ``RateLimit-*``
    headers its answer carries; what its tasks are admitted under."""

    client_id: str | None = None
    headers: Headers = field(default_factory=list)
    owner: Owner = NO_OWNER

    def client_for(self, requested: str) -> str:
        """The client a submission is made for: the authenticated one; a body's ``client_id``
        may only repeat it."""
        if self.client_id is None:
            return requested
        if requested and requested != self.client_id:
            raise ForbiddenError("client_id_mismatch", "client_id in the body names another "
                                 "client than the credential")
        return self.client_id


ANONYMOUS = Caller()


def authenticator(settings: GatewaySettings) -> Authenticator | None:
    if settings.auth == "api_key":
        return ApiKeyAuthenticator(settings.api_key_entries)
    if settings.auth == "jwt":
        return JwtAuthenticator(
            algorithms=settings.jwt_algorithm_names, secret=settings.jwt_secret,
            public_key=settings.jwt_public_key, jwks_url=settings.jwt_jwks_url,
            jwks_refresh_s=settings.jwt_jwks_refresh_s, issuer=settings.jwt_issuer,
            audience=settings.jwt_audience, client_claim=settings.jwt_client_claim,
            weight_claim=settings.jwt_weight_claim,
            leeway_s=settings.jwt_leeway_s)
    return None


class Access:
    """Authenticates, rate-limits, and bounds the open long-polls of each client (in this
    process)."""

    def __init__(self, settings: GatewaySettings, hot: Commands) -> None:
        self.authenticator = authenticator(settings)
        default = Rate.of(settings.rate_limit_per_min, settings.rate_limit_burst)
        self.limiter = RateLimiter(hot, default, dict(settings.rate_limit_overrides))
        self.max_pending = settings.max_pending_per_client
        self.max_waits = settings.max_waits_per_client
        self._waits: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return self.authenticator is not None

    async def check(self, authorization: str | None, api_key: str | None) -> Caller:
        if self.authenticator is None:
            return ANONYMOUS
        try:
            identity = await self.authenticator.authenticate(Credential(authorization, api_key))
        except UnauthorizedError as exc:  # the reason, never the credential
            log.info("refused a request: %s (%s)", exc.code, exc.message)
            raise
        client_id = identity.client_id
        headers = await self.limiter.check(client_id)
        return Caller(client_id, headers, Owner(client_id, self.max_pending, identity.weight))

    @contextmanager
    def waiting(self, caller: Caller) -> Iterator[None]:
        """Hold one of the caller's long-polls for the block (429 past ``max_waits``)."""
        client = caller.client_id
        if client is None or not self.max_waits:
            yield
            return
        if self._waits[client] >= self.max_waits:
            raise TooManyRequestsError("too_many_waits", f"client {client!r} already has "
                                       f"{self.max_waits} open long-polls on this gateway; "
                                       "poll without waiting, or wait for one to end")
        self._waits[client] += 1
        try:
            yield
        finally:
            self._waits[client] -= 1
            if not self._waits[client]:
                del self._waits[client]

    def open_waits(self, client_id: str) -> int:
        """The client's long-polls held now in this process (what ``waiting`` bounds)."""
        return self._waits[client_id]

    async def close(self) -> None:
        if self.authenticator is not None:
            await self.authenticator.close()
