"""JWT bearer tokens, verified with PyJWT under algorithms pinned by configuration.

The key is an HMAC secret (HS*), a PEM public key, or a JWKS document fetched over HTTP(S) and
cached: refreshed every ``jwt_jwks_refresh_s``, and for a token naming an unknown key id at most
once per ``JWKS_MIN_REFETCH_S`` (a stream of made-up key ids cannot turn the gateway into a load
on the identity provider; ``Jwks`` takes another interval as ``min_refetch_s``). ``exp`` is
required; ``nbf``, ``iss`` and ``aud`` are checked when present or configured, with
``jwt_leeway_s`` of clock skew. ``alg: none`` and algorithm confusion (an RS256 public key used
as an HS256 secret) cannot pass: the accepted algorithms come from the configuration, never from
the token, and HMAC and public-key algorithms cannot be mixed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from ferry.auth.base import (
    HMAC_ALGORITHMS,
    Credential,
    Identity,
    check_key_source,
    missing,
    valid_client_id,
    valid_weight,
)
from ferry.errors import ConfigError, DependencyUnavailableError, UnauthorizedError

log = logging.getLogger(__name__)

JWKS_MIN_REFETCH_S = 30.0
JWKS_MAX_BYTES = 1 << 20


class Jwks:
    """The keys of a JWKS URL, by key id, fetched on demand and cached."""

    def __init__(self, url: str, refresh_s: float, timeout_s: float = 5.0,
                 min_refetch_s: float = JWKS_MIN_REFETCH_S) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self.min_refetch_s = min_refetch_s  # between fetches for key ids it does not know
        self._client = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False)
        self._keys: dict[str | None, Any] = {}
        self._fetched_at = -float("inf")
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None) -> Any:
        stale = time.monotonic() - self._fetched_at
        if stale > self.refresh_s or (kid not in self._keys and stale > self.min_refetch_s):
            await self._refresh()
        found = self._keys.get(kid)
        if found is None and kid is None and len(self._keys) == 1:
            found = next(iter(self._keys.values()))
        if found is None:
            raise UnauthorizedError("invalid_token", "the token is signed with a key the "
                                    "gateway does not know", presented=True)
        return found

    async def _refresh(self) -> None:
        async with self._lock:
            if time.monotonic() - self._fetched_at <= self.min_refetch_s:
                return  # another request refreshed it meanwhile
            try:
                response = await self._client.get(self.url)
                response.raise_for_status()
                if len(response.content) > JWKS_MAX_BYTES:
                    raise ValueError("the JWKS document is too large")
                keys = jwt.PyJWKSet.from_dict(response.json()).keys
            except (httpx.HTTPError, ValueError, jwt.PyJWTError) as exc:
                self._fetched_at = time.monotonic()  # try again after the minimum interval
                log.warning("cannot fetch the JWKS at %s: %s", self.url, type(exc).__name__)
                if not self._keys:
                    raise DependencyUnavailableError("the JWT key set cannot be fetched") from exc
                return
            self._keys = {k.key_id: k.key for k in keys}
            self._fetched_at = time.monotonic()

    async def close(self) -> None:
        await self._client.aclose()


class JwtAuthenticator:
    def __init__(self, *, algorithms: tuple[str, ...], secret: str = "", public_key: str = "",  # noqa: PLR0913 - its settings, keyword-only, defaulted
                 jwks_url: str = "", jwks_refresh_s: float = 300.0, issuer: str = "",
                 audience: str = "", client_claim: str = "sub", leeway_s: float = 30.0,
                 weight_claim: str = "") -> None:
        self.algorithms = list(algorithms)
        self.hmac = bool(set(algorithms) & HMAC_ALGORITHMS)
        self._key: Any = None
        self._jwks: Jwks | None = None
        check_key_source(algorithms, secret, public_key, jwks_url)
        if self.hmac:
            self._key = secret.encode()
        elif public_key:
            try:
                self._key = load_pem_public_key(public_key.encode())
            except ValueError:
                raise ConfigError("jwt_public_key is not a PEM public key") from None
        else:
            self._jwks = Jwks(jwks_url, jwks_refresh_s)
        self.issuer = issuer or None
        self.audience = audience or None
        self.client_claim = client_claim
        self.leeway_s = leeway_s
        self.weight_claim = weight_claim  # '': the weight is the settings' for the client

    async def authenticate(self, credential: Credential) -> Identity:
        token = credential.bearer()
        if token is None:
            raise missing()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise _refused("the bearer token is not a JWT") from None
        if header.get("alg") not in self.algorithms:
            raise _refused(f"tokens signed with {str(header.get('alg'))[:16]!r} are not "
                           f"accepted (accepted: {', '.join(self.algorithms)})")
        key = self._key if self._jwks is None else await self._jwks.key(header.get("kid"))
        claims = self._verify(token, key)
        client = claims.get(self.client_claim)
        if not isinstance(client, str | int) or isinstance(client, bool):
            raise _refused(f"the token has no {self.client_claim!r} claim naming the client")
        client_id = valid_client_id(str(client), f"token's {self.client_claim!r} claim")
        if not self.weight_claim or self.weight_claim not in claims:
            return Identity(client_id)
        return Identity(client_id, valid_weight(claims[self.weight_claim],
                                                f"token's {self.weight_claim!r} claim"))

    def _verify(self, token: str, key: Any) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=self.algorithms, audience=self.audience,
                issuer=self.issuer, leeway=self.leeway_s,
                options={"require": ["exp"], "verify_aud": self.audience is not None})
        except jwt.ExpiredSignatureError:
            raise _refused("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise _refused("the token is not valid yet (nbf)") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _refused(f"the token has no {exc.claim!r} claim") from None
        except jwt.InvalidAudienceError:
            raise _refused("the token's audience is not accepted") from None
        except jwt.InvalidIssuerError:
            raise _refused("the token's issuer is not accepted") from None
        except (jwt.PyJWTError, ValueError, TypeError):
            raise _refused("the token's signature does not verify") from None
        return claims

    async def close(self) -> None:
        if self._jwks is not None:
            await self._jwks.close()


def _refused(message: str) -> UnauthorizedError:
    return UnauthorizedError("invalid_token", message, presented=True)
