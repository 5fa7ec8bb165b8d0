"""Where each service's parts are built and wired: the one place to swap a part.

``ferry.compose.gateway`` builds the gateway's parts, ``ferry.compose.batcher`` the batcher's;
neither imports the other, and neither imports the services they build for, so a batcher process
never loads the gateway's modules (nor the gateway the batcher's). Building a part opens nothing;
the service that owns the parts starts and stops them. Tests build parts with their own pieces (a
backend, a metrics registry) and hand them to the service.

The names below are found on first use, so that importing one service's composition does not
import the other's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferry.compose.batcher import BatcherParts, batcher_parts
    from ferry.compose.gateway import GatewayParts, gateway_parts
    from ferry.compose.triton import triton_backend

__all__ = ["BatcherParts", "GatewayParts", "batcher_parts", "gateway_parts", "triton_backend"]
_HOMES = {"BatcherParts": "batcher", "batcher_parts": "batcher", "GatewayParts": "gateway",
          "gateway_parts": "gateway", "triton_backend": "triton"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
