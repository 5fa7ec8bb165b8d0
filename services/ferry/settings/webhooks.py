"""Webhooks: the hosts they may be sent to, parsed once, and the key that signs them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry.errors import ConfigError

if TYPE_CHECKING:
    from ferry.settings.services import CommonSettings


def webhook_hosts(settings: CommonSettings) -> frozenset[str]:
    """``webhook_allowed_hosts`` as lower-case 'host' and 'host:port' entries (none: webhooks
    are off); webhooks are signed, so they need ``webhook_secret``."""
    hosts = frozenset(h.strip().lower() for h in settings.webhook_allowed_hosts.split(",")
                      if h.strip())
    if settings.webhook_allowed_hosts.strip() and not settings.webhook_secret:
        raise ConfigError("webhook_allowed_hosts needs webhook_secret: webhooks are signed")
    return hosts
