"""API keys: configured as SHA-256 hashes (never in clear), each mapped to a client id.

A key is 32 random bytes (``fk_`` + URL-safe base64), so one SHA-256 is a sound hash for it (no
slow hash is needed against guessing). The presented key's hash is compared with every configured
hash in constant time, with no early exit.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from ferry.auth.base import Credential, Identity, missing
from ferry.errors import UnauthorizedError
from ferry.settings.auth import KeyEntry, parse_keys

# A configured key's entry, and how the settings parse them, are the settings': named here too.
__all__ = ["KEY_PREFIX", "ApiKeyAuthenticator", "KeyEntry", "config_line", "key_hash", "new_key",
           "parse_keys"]

KEY_PREFIX = "fk_"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def config_line(client_id: str, key: str) -> str:
    """The ``FERRY_API_KEYS`` entry of a key: ``<client id>:<sha256 of the key>``."""
    return f"{client_id}:{key_hash(key)}"


class ApiKeyAuthenticator:
    def __init__(self, entries: tuple[KeyEntry, ...]) -> None:
        self.entries = entries

    async def authenticate(self, credential: Credential) -> Identity:
        key = credential.bearer()
        if key is None:
            raise missing()
        presented = hashlib.sha256(key.encode()).digest()
        found: KeyEntry | None = None
        for entry in self.entries:  # every entry, whatever matches: no timing of the position
            if hmac.compare_digest(presented, entry.digest):
                found = entry
        if found is None:
            raise UnauthorizedError("invalid_api_key", "the API key is not valid",
                                    presented=True)
        return Identity(found.client_id, found.weight)

    async def close(self) -> None:
        return None
