"""The Triton client both services build from their settings."""

from __future__ import annotations

import ssl

from ferry.settings import CommonSettings
from ferry.triton.grpc_backend import TlsFiles, TritonGrpcBackend
from ferry.triton.http_infer import HttpInferClient


def triton_backend(settings: CommonSettings, infer_timeout_s: float = 30.0,
                   http_url: str = "") -> TritonGrpcBackend:
    """The Triton client of the settings: plain gRPC, or TLS with their CA and client files;
    infer calls over HTTP at ``http_url`` when one is given (over TLS too with triton_ssl)."""
    tls = TlsFiles(settings.triton_ca_file, settings.triton_cert_file,
                   settings.triton_key_file) if settings.triton_ssl else None
    http = None
    if http_url:
        http = HttpInferClient(http_url, timeout_s=infer_timeout_s,
                               ssl_context=_https(tls) if tls is not None else None)
    return TritonGrpcBackend(settings.triton_grpc_target, tls=tls,
                             infer_timeout_s=infer_timeout_s, http=http)


def _https(tls: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca_file or None)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context
