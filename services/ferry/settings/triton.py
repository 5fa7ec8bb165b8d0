"""The Triton settings' checks: TLS to Triton."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry.errors import ConfigError
from ferry.settings.redis import CERTIFICATE_PAIRS

if TYPE_CHECKING:
    from ferry.settings.services import CommonSettings


def check_triton(settings: CommonSettings) -> None:
    """A client certificate comes with its key, and either needs ``triton_ssl``."""
    if bool(settings.triton_cert_file) != bool(settings.triton_key_file):
        raise ConfigError(CERTIFICATE_PAIRS)
    if (settings.triton_ca_file or settings.triton_cert_file) and not settings.triton_ssl:
        raise ConfigError("triton_ca_file and triton_cert_file need triton_ssl=true")
