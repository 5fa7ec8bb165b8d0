"""The gateway's name for who may use the hot routes; the rules live in ``ferry.access``.

Kept so that modules which import ``ferry.gateway.access`` go on working while they move to
``ferry.access`` (the composition root builds ``Access`` without importing the gateway).
"""

from __future__ import annotations

from ferry.access import ANONYMOUS, Access, Caller

__all__ = ["ANONYMOUS", "Access", "Caller"]
