"""The Triton client both services build from their settings: every server of ``triton_url``
as one pool (``ferry.triton.pool``)."""

from __future__ import annotations

import ssl

from ferry.settings import CommonSettings
from ferry.triton.endpoints import Address, parse_targets
from ferry.triton.grpc_backend import TlsFiles, TritonGrpcBackend
from ferry.triton.http_infer import HttpInferClient
from ferry.triton.pool import PoolHooks, TritonPool


def triton_backend(settings: CommonSettings, infer_timeout_s: float = 30.0,
                   http_url: str = "", hooks: PoolHooks | None = None) -> TritonPool:
    """The Triton servers of the settings: plain gRPC, or TLS with their CA and client files;
    infer calls over HTTP at ``http_url``'s addresses when given (over TLS too with
    triton_ssl). A server reached by an address its name resolved to verifies that name."""
    tls = TlsFiles(settings.triton_ca_file, settings.triton_cert_file,
                   settings.triton_key_file) if settings.triton_ssl else None
    https = _https(tls) if tls is not None else None

    def server(address: Address) -> TritonGrpcBackend:
        name = address.target.host if address.target.named else ""
        http = None
        if address.http:
            http = HttpInferClient(address.http, timeout_s=infer_timeout_s, ssl_context=https,
                                   server_name=name)
        return TritonGrpcBackend(address.name, tls=tls, infer_timeout_s=infer_timeout_s,
                                 http=http, server_name=name)

    return TritonPool(parse_targets(settings.triton_url, http_url), server,
                      resolve_s=settings.triton_resolve_s, hooks=hooks)


def _https(tls: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca_file or None)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context
