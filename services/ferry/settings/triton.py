"""The Triton settings' checks: its addresses (the targets of ``triton_url`` and
``triton_http_url``, which ``ferry.triton.endpoints`` resolves), TLS to Triton."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ferry.errors import ConfigError
from ferry.settings.redis import CERTIFICATE_PAIRS

_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def check_triton(*, triton_url: str, triton_http_url: str, triton_resolve_s: float,
                 triton_ssl: bool, triton_ca_file: str, triton_cert_file: str,
                 triton_key_file: str) -> None:
    """Triton's addresses parse (the HTTP ones, a batcher's, one per gRPC address); a client
    certificate comes with its key, and either needs ``triton_ssl``."""
    if triton_url:  # empty for ``ferry up``: it starts one
        parse_targets(triton_url, triton_http_url)
    if triton_resolve_s <= 0:
        raise ConfigError("triton_resolve_s must be more than 0")
    if bool(triton_cert_file) != bool(triton_key_file):
        raise ConfigError(CERTIFICATE_PAIRS)
    if (triton_ca_file or triton_cert_file) and not triton_ssl:
        raise ConfigError("triton_ca_file and triton_cert_file need triton_ssl=true")


@dataclass(frozen=True)
class Target:
    """One configured Triton: its host, gRPC port and, for infer calls over HTTP, HTTP port."""

    host: str
    grpc_port: int
    http_port: int | None = None

    @property
    def named(self) -> bool:
        """Whether the host is a name to look up (not an address)."""
        return not _is_ip(self.host)

    def __str__(self) -> str:
        return host_port(self.host, self.grpc_port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split(entry: str, what: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host in brackets) as its parts; a ConfigError naming the entry."""
    hostport = entry.strip().removeprefix("grpc://").removeprefix("http://").rstrip("/")
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    if not (_HOST.fullmatch(host) or _is_ip(host)) or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} entries are host:port, comma-separated: {entry.strip()!r} "
                          "is not")
    return host, int(port)


def parse_targets(grpc_urls: str, http_urls: str = "") -> tuple[Target, ...]:
    """The targets of ``triton_url`` and ``triton_http_url`` (paired by position)."""
    if not grpc_urls.strip():
        raise ConfigError("triton_url names no Triton: give host:port, comma-separated")
    grpc = grpc_urls.split(",")
    http = http_urls.split(",") if http_urls.strip() else []
    for name, entries in (("triton_url", grpc), ("triton_http_url", http)):
        if not all(entry.strip() for entry in entries):
            raise ConfigError(f"{name} has an empty entry: {','.join(entries)!r} (host:port, "
                              "comma-separated, no empty ones)")
    if http and len(http) != len(grpc):
        raise ConfigError(f"triton_http_url has {len(http)} entries and triton_url {len(grpc)}: "
                          "give one HTTP address per gRPC address, in the same order")
    targets: list[Target] = []
    for index, entry in enumerate(grpc):
        host, port = _split(entry, "triton_url")
        http_port = None
        if http:
            http_host, http_port = _split(http[index], "triton_http_url")
            if http_host != host:
                raise ConfigError(f"triton_http_url's entry {index + 1} ({http_host}) is not "
                                  f"on triton_url's host ({host}): pair them by position")
        targets.append(Target(host, port, http_port))
    if len(set(targets)) != len(targets):
        raise ConfigError(f"triton_url names a target twice: {grpc_urls!r}")
    return tuple(targets)
