"""The Triton client both services build from their settings."""

from __future__ import annotations

from ferry.settings import CommonSettings
from ferry.triton.grpc_backend import TlsFiles, TritonGrpcBackend


def triton_backend(settings: CommonSettings, infer_timeout_s: float = 30.0) -> TritonGrpcBackend:
    """The Triton client of the settings: plain gRPC, or TLS with their CA and client files."""
    tls = TlsFiles(settings.triton_ca_file, settings.triton_cert_file,
                   settings.triton_key_file) if settings.triton_ssl else None
    return TritonGrpcBackend(settings.triton_grpc_target, tls=tls,
                             infer_timeout_s=infer_timeout_s)
