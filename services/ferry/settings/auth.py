"""Who may use the API: the auth mode, the API keys, the JWT algorithms, the per-client rates and
limits, and the admin token; parsed once, when the gateway's settings are built.

The values they are parsed into (``KeyEntry``, ``Rate``) and the rules they obey (what a client
id, a weight and a JWT algorithm may be) live here, below ``ferry.auth``, which uses them and
names them too: the settings import no feature."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ferry.errors import ConfigError
from ferry.settings.fields import entries, refuse_duplicates

AUTH_MODES = ("none", "api_key", "jwt")
MIN_ADMIN_TOKEN = 24
HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
PUBLIC_KEY_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                   "ES256", "ES384", "ES512", "EdDSA"})
CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")  # printable, no spaces: a key and a label
MAX_WEIGHT = 1_000_000.0  # weights are relative: anything above a million to one is a typo
AUTO_BURST_MAX = 100  # the most requests at once that a rate's own burst allows


# --- the settings' checks, each from the settings it reads ------------------------------------

def api_key_entries(auth: str, api_keys: str) -> tuple[KeyEntry, ...]:
    """The API keys with ``auth=api_key`` (none otherwise: ``api_keys`` is then not read)."""
    if auth not in AUTH_MODES:
        raise ConfigError(f"auth must be one of {', '.join(AUTH_MODES)}, not {auth!r}")
    if auth != "api_key":
        return ()
    entries("api_keys", api_keys, lines=True)
    keys = parse_keys(api_keys)
    # one client may have several keys (a new one beside the old), a key only one client
    refuse_duplicates("api_keys", (key.digest for key in keys), "a key hash")
    return keys


def jwt_algorithm_names(*, auth: str, jwt_algorithms: str, jwt_secret: str, jwt_public_key: str,
                        jwt_jwks_url: str) -> tuple[str, ...]:
    """The JWT algorithms accepted with ``auth=jwt``, checked against the key given for them
    (none otherwise: the ``jwt_*`` settings are then not read)."""
    if auth != "jwt":
        return ()
    entries("jwt_algorithms", jwt_algorithms)
    algorithms = parse_algorithms(jwt_algorithms)
    refuse_duplicates("jwt_algorithms", algorithms)
    check_key_source(algorithms, jwt_secret, jwt_public_key, jwt_jwks_url)
    return algorithms


def rate_limit_overrides(*, rate_limits: str, rate_limit_per_min: int, rate_limit_burst: int,
                         max_pending_per_client: int,
                         max_waits_per_client: int) -> Mapping[str, Rate]:
    """The per-client rates of ``rate_limits``, after the limits every client has."""
    if rate_limit_per_min < 0 or rate_limit_burst < 0:
        raise ConfigError("rate_limit_per_min and rate_limit_burst must be >= 0")
    if max_pending_per_client < 0 or max_waits_per_client < 0:
        raise ConfigError("max_pending_per_client and max_waits_per_client must be >= 0")
    clients = [part.rpartition("=")[0].strip() for part in entries("rate_limits", rate_limits)]
    rates = parse_overrides(rate_limits, rate_limit_burst)
    for client in clients:
        if not CLIENT_ID.fullmatch(client):
            raise ConfigError(f"rate_limits: {client!r} is not a client id (letters, digits, "
                              "._:@/+=-)")
    refuse_duplicates("rate_limits", clients)
    return rates


def check_admin_token(admin_token: str) -> None:
    """An admin token, when there is one, is long enough not to be guessed."""
    if admin_token and len(admin_token) < MIN_ADMIN_TOKEN:
        raise ConfigError(f"admin_token must have at least {MIN_ADMIN_TOKEN} characters")


# --- API keys ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyEntry:
    """One configured API key: its client, the key's SHA-256, and the weight it gives."""

    client_id: str
    digest: bytes  # SHA-256 of the key
    weight: float | None = None  # the client's fair-share weight, if the entry gives one


def parse_keys(spec: str) -> tuple[KeyEntry, ...]:
    """``client:sha256hex[:weight]`` entries, separated by commas or new lines (a file's
    lines); the weight, if given, is the client's fair-share weight."""
    found: list[KeyEntry] = []
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
            found.append(KeyEntry(client_id, bytes.fromhex(digest), weight))
        except ValueError:
            raise ConfigError("api_keys: a key hash is not hexadecimal") from None
    if not found:
        raise ConfigError("auth=api_key needs api_keys (or FERRY_API_KEYS_FILE)")
    return tuple(found)


def _weight(text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan  # refused below, with the same words as a weight out of range
    if not 0 < weight <= MAX_WEIGHT:
        raise ConfigError(f"api_keys: an entry's weight, {text[:20]!r}, is not a number above "
                          f"0 and at most {MAX_WEIGHT:g}")
    return weight


# --- rates ------------------------------------------------------------------------------------

def scaled_burst(per_min: int) -> int:
    """The burst of a rate that names none: a tenth of the per-minute rate (six seconds of it),
    at least 1 and at most ``AUTO_BURST_MAX``; so a low rate limits from the first request
    (30 a minute: 3 at once, not 100)."""
    return max(1, min(AUTO_BURST_MAX, per_min // 10))


@dataclass(frozen=True)
class Rate:
    """A client's rate: requests a minute, sustained, and how many may come at once."""

    per_min: int
    burst: int

    @classmethod
    def of(cls, per_min: int, burst: int = 0) -> Rate:
        """The rate, its burst scaled from it when ``burst`` is 0."""
        return cls(per_min, burst or scaled_burst(per_min))

    @property
    def interval_ms(self) -> float:
        return 60_000.0 / self.per_min

    @property
    def policy(self) -> bytes:
        return b"%d;w=60;burst=%d" % (self.per_min, self.burst)


def parse_overrides(spec: str, default_burst: int = 0) -> dict[str, Rate]:
    """``client=per_min[/burst]`` entries, comma-separated (0 per minute: unlimited); an entry
    without a burst gets ``default_burst`` (0: scaled from its own rate)."""
    rates: dict[str, Rate] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        client, sep, value = part.rpartition("=")
        per_min, _, burst = value.partition("/")
        try:
            given = int(burst) if burst else None
            rate = Rate(-1, -1) if given == 0 else Rate.of(int(per_min), given or default_burst)
        except ValueError:
            rate = Rate(-1, -1)
        if not sep or not client or rate.per_min < 0 or rate.burst < 1:
            raise ConfigError(f"rate_limits: {part!r} is not 'client=per_min' or "
                              "'client=per_min/burst'")
        rates[client.strip()] = rate
    return rates


# --- JWTs -------------------------------------------------------------------------------------

def parse_algorithms(spec: str) -> tuple[str, ...]:
    """The JWT algorithms ``spec`` names: known ones, HMAC or public-key ones, not both."""
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
