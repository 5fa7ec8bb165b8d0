"""The gateway's gRPC port: Triton's ``GRPCInferenceService`` (``ferry.oip.grpc_service``) in
the gateway's own event loop, beside its HTTP port.

Several gateway processes (``FERRY_WORKERS``) each bind the port with ``SO_REUSEPORT`` and the
kernel spreads connections over them, as it spreads the HTTP ones; a single process binds it
alone, so that a port already taken is an error at start, not a port silently shared.
"""

from __future__ import annotations

import grpc
from tritonclient.grpc import service_pb2_grpc

from ferry.errors import StartupError
from ferry.oip.grpc_service import InferenceService
from ferry.settings import GatewaySettings

STOP_GRACE_S = 3.0  # held calls still open at a stop get this long to end
# A client connection is asked to go away (GOAWAY; its open calls still finish) after this
# long, so that clients behind a plain Service spread over gateways that came up since.
MAX_CONNECTION_AGE_MS = 300_000


class GrpcPort:
    """The gRPC server of one gateway process: started and stopped with the gateway."""

    def __init__(self, settings: GatewaySettings, service: InferenceService) -> None:
        self.settings = settings
        self.service = service
        self.server: grpc.aio.Server | None = None

    def options(self) -> list[tuple[str, int]]:
        shared = self.settings.workers != 1
        return [("grpc.max_receive_message_length", self.settings.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1 if shared else 0),
                ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
                # a connection that has not begun HTTP/2 (sent its preface) by then is closed, as
                # the HTTP port closes one that sends no request (gRPC's default: 120 s)
                ("grpc.server_handshake_timeout_ms", int(self.settings.header_timeout_s * 1000))]

    async def start(self) -> None:
        server = grpc.aio.server(options=self.options())
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            self.service, server)
        address = f"{self.settings.host}:{self.settings.grpc_port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise StartupError(f"cannot listen for gRPC on {address}: {exc}") from exc
        if not bound:
            raise StartupError(f"cannot listen for gRPC on {address} (in use?)")
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(STOP_GRACE_S)
            self.server = None
