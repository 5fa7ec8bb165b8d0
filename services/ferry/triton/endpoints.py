"""Where Triton is: the configured targets (``FERRY_TRITON_URL``, ``FERRY_TRITON_HTTP_URL``) and
the endpoints they resolve to.

A target is ``host:port``; several are comma-separated. A host that is an address is one
endpoint; a name is as many endpoints as addresses it resolves to (a headless Service answers
with one per ready pod), looked up again every few seconds by the pool. IPv4 answers are used
when there are any, else IPv6 ones: ``localhost`` is one server, not two.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ferry.settings.triton import Target, host_port, parse_targets

# A target, and how the settings parse them when they are built, are the settings' (they import
# no feature): named here too.
__all__ = ["Address", "Lookup", "Target", "parse_targets", "pick_family", "resolve"]

# (host, port) -> the addresses it resolves to, as ``loop.getaddrinfo`` answers them.
Lookup = Callable[[str, int], Awaitable[Sequence[tuple[int, str]]]]


@dataclass(frozen=True)
class Address:
    """One Triton server: a target's host resolved to one address."""

    target: Target
    ip: str

    @property
    def name(self) -> str:
        """``ip:port`` of its gRPC endpoint: the endpoint's name in metrics and logs."""
        return host_port(self.ip, self.target.grpc_port)

    @property
    def http(self) -> str:
        """``ip:port`` of its HTTP endpoint ('' when infer calls stay on gRPC)."""
        port = self.target.http_port
        return host_port(self.ip, port) if port is not None else ""


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
