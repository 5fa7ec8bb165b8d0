"""Reading the usage ledger: every partition's hash of every hour in a window, in one pipeline
(split by node on a Redis Cluster), added up (``ferry.usage.ledger``)."""

from __future__ import annotations

import time

from ferry import keys
from ferry.resp.client import Commands
from ferry.usage import ledger
from ferry.usage.ledger import Usage


class LedgerReader:
    """What each client cost over a window, from every batcher's counts."""

    def __init__(self, client: Commands, partitions: int) -> None:
        self.client = client
        self.partitions = partitions

    async def usage(self, since_s: float, model: str = "", now: float | None = None
                    ) -> list[Usage]:
        """Per client and model over the hours from ``since_s`` ago to now (whole hours: the
        first one from its start), the most GPU time first."""
        now = time.time() if now is None else now
        commands = [("HGETALL", keys.ledger_key(partition, hour))
                    for hour in ledger.hours_between(now - since_s, now)
                    for partition in range(self.partitions)]
        replies = await self.client.pipeline(commands)
        return ledger.summed(({reply[i].decode(): int(reply[i + 1])
                               for i in range(0, len(reply), 2)} for reply in replies if reply),
                             model)
