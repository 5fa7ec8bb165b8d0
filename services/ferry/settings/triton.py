"""The Triton settings' checks: its addresses, TLS to Triton."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry.errors import ConfigError
from ferry.settings.redis import CERTIFICATE_PAIRS
from ferry.triton.endpoints import parse_targets

if TYPE_CHECKING:
    from ferry.settings.services import CommonSettings


def check_triton(settings: CommonSettings) -> None:
    """Triton's addresses parse (the HTTP ones, a batcher's, one per gRPC address); a client
    certificate comes with its key, and either needs ``triton_ssl``."""
    if settings.triton_url:  # empty for ``ferry up``: it starts one
        parse_targets(settings.triton_url, getattr(settings, "triton_http_url", ""))
    if settings.triton_resolve_s <= 0:
        raise ConfigError("triton_resolve_s must be more than 0")
    if bool(settings.triton_cert_file) != bool(settings.triton_key_file):
        raise ConfigError(CERTIFICATE_PAIRS)
    if (settings.triton_ca_file or settings.triton_cert_file) and not settings.triton_ssl:
        raise ConfigError("triton_ca_file and triton_cert_file need triton_ssl=true")
