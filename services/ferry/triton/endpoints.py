"""Where Triton is: the configured targets (``FERRY_TRITON_URL``, ``FERRY_TRITON_HTTP_URL``) and
the endpoints they resolve to.

A target is ``host:port``; several are comma-separated. A host that is an address is one
endpoint; a name is as many endpoints as addresses it resolves to (a headless Service answers
with one per ready pod), looked up again every few seconds by the pool. IPv4 answers are used
when there are any, else IPv6 ones: ``localhost`` is one server, not two.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ferry.errors import ConfigError

# (host, port) -> the addresses it resolves to, as ``loop.getaddrinfo`` answers them.
Lookup = Callable[[str, int], Awaitable[Sequence[tuple[int, str]]]]


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
        return _join(self.host, self.grpc_port)


@dataclass(frozen=True)
class Address:
    """One Triton server: a target's host resolved to one address."""

    target: Target
    ip: str

    @property
    def name(self) -> str:
        """``ip:port`` of its gRPC endpoint: the endpoint's name in metrics and logs."""
        return _join(self.ip, self.target.grpc_port)

    @property
    def http(self) -> str:
        """``ip:port`` of its HTTP endpoint ('' when infer calls stay on gRPC)."""
        port = self.target.http_port
        return _join(self.ip, port) if port is not None else ""


_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _join(host: str, port: int) -> str:
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


def pick_family(found: Sequence[tuple[int, str]]) -> list[str]:
    """The addresses of a lookup, IPv4 when there are any, each once, in a stable order."""
    v4 = sorted({ip for family, ip in found if family == socket.AF_INET})
    return v4 or sorted({ip for family, ip in found if family == socket.AF_INET6})


async def resolve(target: Target, lookup: Lookup) -> list[Address]:
    """The servers a target stands for now (an address is itself)."""
    if not target.named:
        return [Address(target, target.host)]
    return [Address(target, ip) for ip in pick_family(await lookup(target.host,
                                                                   target.grpc_port))]
