"""What every authenticator shares: the credential a request presents, and who it proves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ferry.errors import UnauthorizedError
from ferry.settings.auth import (
    CLIENT_ID,
    HMAC_ALGORITHMS,
    MAX_WEIGHT,
    PUBLIC_KEY_ALGORITHMS,
    check_key_source,
    parse_algorithms,
)

# What a client id, a weight and a JWT algorithm may be is the settings' (they parse the keys,
# weights and algorithms configured, and import no feature); named here too.
__all__ = ["CLIENT_ID", "HMAC_ALGORITHMS", "MAX_WEIGHT", "PUBLIC_KEY_ALGORITHMS", "Authenticator",
           "Credential", "Identity", "check_key_source", "missing", "parse_algorithms",
           "valid_client_id", "valid_weight"]


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
