"""Finding a Redis master through Redis Sentinel, as Sentinel's client guidelines describe.

Each sentinel is asked in turn for the master's address (``SENTINEL GET-MASTER-ADDR-BY-NAME``);
the first that answers is asked first next time. A client connects to that address and checks
with ``ROLE`` that it is a master (a demoted one is a replica until the sentinels say otherwise),
and looks again whenever its connection breaks or Redis answers ``READONLY``. So a failover is
followed without a restart: the commands in flight fail (their effect unknown), the next ones go
to the new master.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ferry.errors import RedisError
from ferry.resp.client import (
    Command,
    RedisAddress,
    RespConnectionError,
    _Connection,
    handshake,
    open_connection,
)


class Sentinels:
    """Where the master named ``master`` is, by the sentinels' word; ``template`` gives the
    database, credentials and TLS of the master's address (and the sentinels' TLS)."""

    def __init__(self, nodes: Sequence[tuple[str, int]], master: str, template: RedisAddress,
                 *, password: str = "", timeout_s: float = 2.0) -> None:
        self.master_name = master
        self.template = template
        self.timeout_s = timeout_s
        self._sentinels = [RedisAddress(host=h, port=p, password=password or None,
                                        tls=template.tls, ssl_context=template.ssl_context)
                           for h, p in nodes]

    async def master(self) -> RedisAddress:
        """The master's address, from the first sentinel that knows it."""
        problems: list[str] = []
        for sentinel in list(self._sentinels):
            try:
                found = await self._ask(sentinel)
            except (RedisError, TimeoutError) as exc:
                problems.append(f"{sentinel}: {exc}")
                continue
            if found is None:
                problems.append(f"{sentinel}: no master named {self.master_name!r}")
                continue
            self._sentinels.remove(sentinel)  # the one that answered is asked first next time
            self._sentinels.insert(0, sentinel)
            return replace(self.template, host=found[0], port=found[1], path=None)
        raise RespConnectionError(f"no sentinel gave the address of master {self.master_name!r}"
                                  f" ({'; '.join(problems)})")

    async def _ask(self, sentinel: RedisAddress) -> tuple[str, int] | None:
        loop = asyncio.get_running_loop()
        connection = await open_connection(
            sentinel, lambda: _Connection(loop, self.timeout_s), self.timeout_s)
        try:
            commands: list[Command] = [*handshake(sentinel, "ferry-sentinel-lookup",
                                                  select=False),
                                       ("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)]
            replies = await asyncio.gather(*connection.send(commands), return_exceptions=True)
        finally:
            connection.close()
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return parse_master_reply(replies[-1])


def parse_master_reply(reply: Any) -> tuple[str, int] | None:
    """(host, port) of a ``GET-MASTER-ADDR-BY-NAME`` reply; None for an unknown master."""
    if not reply:
        return None
    host, port = reply[0], reply[1]
    return (host.decode() if isinstance(host, bytes) else str(host)), int(port)
