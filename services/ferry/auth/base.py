"""What every authenticator shares: the credential a request presents, and who it proves."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from ferry.errors import ConfigError, UnauthorizedError

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
PUBLIC_KEY_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                   "ES256", "ES384", "ES512", "EdDSA"})
CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")  # printable, no spaces: a key and a label


@dataclass(frozen=True)
class Credential:
    """What a request presents: ``Authorization: Bearer <token>`` or ``X-API-Key: <key>``."""

    authorization: str | None = None
    api_key: str | None = None

    def bearer(self) -> str | None:
        """The token of a Bearer authorization, the API key header's value, or None."""
        if self.api_key:
            return self.api_key.strip() or None
        if not self.authorization:
            return None
        scheme, _, token = self.authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthorizedError("invalid_authorization", "Authorization must be "
                                    "'Bearer <credential>'", presented=True)
        return token.strip()


@dataclass(frozen=True)
class Identity:
    """Who a credential proves: its client, and the fair-share weight the credential itself
    gives (a JWT's claim, an API key's entry; None: the settings' weight for the client)."""

    client_id: str
    weight: float | None = None


MAX_WEIGHT = 1_000_000.0  # weights are relative: anything above a million to one is a typo


def valid_weight(value: object, source: str) -> float:
    """A fair-share weight: a number above 0 and at most MAX_WEIGHT, or a 401 naming
    ``source``."""
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or not 0 < number <= MAX_WEIGHT:
        raise UnauthorizedError("invalid_weight", f"the {source} is not a weight above 0 and "
                                f"at most {MAX_WEIGHT:g}", presented=True)
    return float(number)


class Authenticator(Protocol):
    """Turns a request's credential into the client it proves, or refuses it (401)."""

    async def authenticate(self, credential: Credential) -> Identity:
        ...

    async def close(self) -> None:
        ...


def missing() -> UnauthorizedError:
    return UnauthorizedError("unauthenticated", "this gateway needs a credential: "
                             "'Authorization: Bearer <credential>' or 'X-API-Key: <key>'")


def valid_client_id(client_id: str, source: str) -> str:
    if not CLIENT_ID.fullmatch(client_id):
        raise UnauthorizedError("invalid_client_id", f"the {source} names no usable client id "
                                "(1-128 letters, digits or ._:@/+=-)", presented=True)
    return client_id


def parse_algorithms(spec: str) -> tuple[str, ...]:
    algorithms = tuple(a.strip() for a in spec.split(",") if a.strip())
    unknown = [a for a in algorithms if a not in HMAC_ALGORITHMS | PUBLIC_KEY_ALGORITHMS]
    if not algorithms or unknown:
        raise ConfigError(f"jwt_algorithms {spec!r}: name one or more of "
                          f"{sorted(HMAC_ALGORITHMS | PUBLIC_KEY_ALGORITHMS)} ('none' is never "
                          "accepted)")
    if set(algorithms) & HMAC_ALGORITHMS and set(algorithms) & PUBLIC_KEY_ALGORITHMS:
        raise ConfigError("jwt_algorithms: HMAC (HS*) and public-key algorithms cannot be "
                          "mixed: one key would serve as both (algorithm confusion)")
    return algorithms


def check_key_source(algorithms: tuple[str, ...], secret: str, public_key: str,
                     jwks_url: str) -> None:
    """That the configuration names a key for its algorithms (``ConfigError`` if not)."""
    if set(algorithms) & HMAC_ALGORITHMS:
        if len(secret) < 32:
            raise ConfigError("HS* JWTs need jwt_secret of at least 32 characters")
    elif not public_key and not jwks_url:
        raise ConfigError("public-key JWTs need jwt_public_key (PEM) or jwt_jwks_url")
