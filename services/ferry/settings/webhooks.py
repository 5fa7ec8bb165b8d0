"""Webhooks: the hosts they may be sent to, parsed once, and the key that signs them."""

from __future__ import annotations

import re

from ferry.errors import ConfigError
from ferry.settings.fields import entries, refuse_duplicates

# A callback's host, or host:port, as the check compares them: a URL, a path or brackets
# around an IPv6 address would never match one, and so are refused rather than ignored.
HOST = re.compile(r"[a-z0-9._:-]+")


def webhook_hosts(webhook_allowed_hosts: str, webhook_secret: str) -> frozenset[str]:
    """``webhook_allowed_hosts`` as lower-case 'host' and 'host:port' entries (none: webhooks
    are off); webhooks are signed, so they need ``webhook_secret``."""
    hosts = [host.lower() for host in entries("webhook_allowed_hosts", webhook_allowed_hosts)]
    for host in hosts:
        if not HOST.fullmatch(host):
            raise ConfigError(f"webhook_allowed_hosts: {host!r} is not 'host' or 'host:port'")
    refuse_duplicates("webhook_allowed_hosts", hosts)
    if hosts and not webhook_secret:
        raise ConfigError("webhook_allowed_hosts needs webhook_secret: webhooks are signed")
    return frozenset(hosts)
