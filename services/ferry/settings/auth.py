"""Who may use the API: the auth mode, the API keys, the JWT algorithms, the per-client rates and
limits, and the admin token; parsed once, when the gateway's settings are built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ferry.auth.api_keys import KeyEntry, parse_keys
from ferry.auth.base import CLIENT_ID, check_key_source, parse_algorithms
from ferry.auth.rate_limit import Rate, parse_overrides
from ferry.errors import ConfigError
from ferry.settings.fields import entries, refuse_duplicates

if TYPE_CHECKING:
    from ferry.settings.services import GatewaySettings

AUTH_MODES = ("none", "api_key", "jwt")
MIN_ADMIN_TOKEN = 24


def api_key_entries(settings: GatewaySettings) -> tuple[KeyEntry, ...]:
    """The API keys with ``auth=api_key`` (none otherwise: ``api_keys`` is then not read)."""
    if settings.auth not in AUTH_MODES:
        raise ConfigError(f"auth must be one of {', '.join(AUTH_MODES)}, not {settings.auth!r}")
    if settings.auth != "api_key":
        return ()
    entries("api_keys", settings.api_keys, lines=True)
    keys = parse_keys(settings.api_keys)
    # one client may have several keys (a new one beside the old), a key only one client
    refuse_duplicates("api_keys", (key.digest for key in keys), "a key hash")
    return keys


def jwt_algorithm_names(settings: GatewaySettings) -> tuple[str, ...]:
    """The JWT algorithms accepted with ``auth=jwt``, checked against the key given for them
    (none otherwise: the ``jwt_*`` settings are then not read)."""
    if settings.auth != "jwt":
        return ()
    entries("jwt_algorithms", settings.jwt_algorithms)
    algorithms = parse_algorithms(settings.jwt_algorithms)
    refuse_duplicates("jwt_algorithms", algorithms)
    check_key_source(algorithms, settings.jwt_secret, settings.jwt_public_key,
                     settings.jwt_jwks_url)
    return algorithms


def rate_limit_overrides(settings: GatewaySettings) -> Mapping[str, Rate]:
    """The per-client rates of ``rate_limits``, after the limits every client has."""
    if settings.rate_limit_per_min < 0 or settings.rate_limit_burst < 0:
        raise ConfigError("rate_limit_per_min and rate_limit_burst must be >= 0")
    if settings.max_pending_per_client < 0 or settings.max_waits_per_client < 0:
        raise ConfigError("max_pending_per_client and max_waits_per_client must be >= 0")
    clients = [part.rpartition("=")[0].strip() for part in entries("rate_limits",
                                                                    settings.rate_limits)]
    rates = parse_overrides(settings.rate_limits, settings.rate_limit_burst)
    for client in clients:
        if not CLIENT_ID.fullmatch(client):
            raise ConfigError(f"rate_limits: {client!r} is not a client id (letters, digits, "
                              "._:@/+=-)")
    refuse_duplicates("rate_limits", clients)
    return rates


def check_admin_token(settings: GatewaySettings) -> None:
    """An admin token, when there is one, is long enough not to be guessed."""
    if settings.admin_token and len(settings.admin_token) < MIN_ADMIN_TOKEN:
        raise ConfigError(f"admin_token must have at least {MIN_ADMIN_TOKEN} characters")
