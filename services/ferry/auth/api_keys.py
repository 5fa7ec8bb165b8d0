"""API keys: configured as SHA-256 hashes (never in clear), each mapped to a client id.

A key is 32 random bytes (``fk_`` + URL-safe base64), so one SHA-256 is a sound hash for it (no
slow hash is needed against guessing). The presented key's hash is compared with every configured
hash in constant time, with no early exit.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from ferry.auth.base import CLIENT_ID, MAX_WEIGHT, Credential, Identity, missing, valid_weight
from ferry.errors import ConfigError, UnauthorizedError

KEY_PREFIX = "fk_"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def config_line(client_id: str, key: str) -> str:
    """The ``FERRY_API_KEYS`` entry of a key: ``<client id>:<sha256 of the key>``."""
    return f"{client_id}:{key_hash(key)}"


@dataclass(frozen=True)
class KeyEntry:
    client_id: str
    digest: bytes  # SHA-256 of the key
    weight: float | None = None  # the client's fair-share weight, if the entry gives one


def parse_keys(spec: str) -> tuple[KeyEntry, ...]:
    """``client:sha256hex[:weight]`` entries, separated by commas or new lines (a file's
    lines); the weight, if given, is the client's fair-share weight."""
    entries: list[KeyEntry] = []
    for part in filter(None, (p.strip() for p in spec.replace("\n", ",").split(","))):
        client_id, sep, digest = part.rpartition(":")
        weight: float | None = None
        if sep and len(digest) != 64:  # a weight after the hash
            weight = _weight(digest)
            client_id, sep, digest = client_id.rpartition(":")
        if not sep or not CLIENT_ID.fullmatch(client_id) or len(digest) != 64:
            raise ConfigError("api_keys: entries are '<client id>:<sha256 hex of the key>"
                              "[:<weight>]' (see 'ferry keys new'); one is not")
        try:
            entries.append(KeyEntry(client_id, bytes.fromhex(digest), weight))
        except ValueError:
            raise ConfigError("api_keys: a key hash is not hexadecimal") from None
    if not entries:
        raise ConfigError("auth=api_key needs api_keys (or FERRY_API_KEYS_FILE)")
    return tuple(entries)


def _weight(text: str) -> float:
    try:
        return valid_weight(float(text), "weight")
    except (ValueError, UnauthorizedError):
        raise ConfigError(f"api_keys: an entry's weight, {text[:20]!r}, is not a number above "
                          f"0 and at most {MAX_WEIGHT:g}") from None


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
