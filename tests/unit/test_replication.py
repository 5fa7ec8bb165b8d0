"""The WAIT group commit's logic, with a scripted connection (the integration tests in
tests/integration/test_redis_ha.py run it against real replicas)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from ferry.resp.client import RespClient
from ferry.tasks.replication import ReplicaAcks, Written


class ScriptedNode:
    """What ReplicaAcks uses of a RespClient: its live connection, and WAITs that answer when
    the test says so."""

    timeout_s = 1.0

    def __init__(self) -> None:
        self.live: object | None = object()
        self.waits: list[asyncio.Future[int]] = []
        self.rechecks = 0

    async def execute(self, *command: Any, timeout_s: float | None = None) -> int:
        assert command[0] == "WAIT"
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waits.append(answer)
        return await answer

    def recheck_soon(self) -> None:
        self.rechecks += 1


def _written(node: ScriptedNode) -> Written:
    return Written(reply=None, target=cast(RespClient, node), connection=node.live)


async def test_the_admissions_of_one_turn_share_one_wait() -> None:
    node = ScriptedNode()
    acks = ReplicaAcks(cast(Any, node), replicas=1, wait_ms=100)
    callers = [asyncio.ensure_future(acks.confirmed(_written(node))) for _ in range(5)]
    await turns()
    assert len(node.waits) == 1
    node.waits[0].set_result(1)
    assert await asyncio.gather(*callers) == [True] * 5


async def test_one_wait_is_out_at_a_time_and_the_callers_meanwhile_share_the_next() -> None:
    node = ScriptedNode()
    acks = ReplicaAcks(cast(Any, node), replicas=1, wait_ms=100)
    first = asyncio.ensure_future(acks.confirmed(_written(node)))
    await turns()
    later = [asyncio.ensure_future(acks.confirmed(_written(node))) for _ in range(3)]
    await turns()
    assert len(node.waits) == 1  # the next is not sent while the first is out
    node.waits[0].set_result(0)  # the first: no replica in time
    assert await first is False and node.rechecks == 1
    await turns()
    assert len(node.waits) == 2
    node.waits[1].set_result(1)
    assert await asyncio.gather(*later) == [True] * 3


async def test_a_write_on_a_connection_since_replaced_is_never_confirmed() -> None:
    node = ScriptedNode()
    acks = ReplicaAcks(cast(Any, node), replicas=1, wait_ms=100)
    written = _written(node)
    node.live = object()  # the connection broke and another was opened before the WAIT
    assert await acks.confirmed(written) is False
    assert node.waits == []


async def test_a_connection_replaced_while_its_wait_is_out_confirms_nothing() -> None:
    node = ScriptedNode()
    acks = ReplicaAcks(cast(Any, node), replicas=1, wait_ms=100)
    caller = asyncio.ensure_future(acks.confirmed(_written(node)))
    await turns()
    node.live = object()
    node.waits[0].set_result(2)  # answered, but on the new connection: covers none of it
    assert await caller is False


async def test_a_round_left_by_a_replaced_connection_ends_unconfirmed() -> None:
    node = ScriptedNode()
    acks = ReplicaAcks(cast(Any, node), replicas=1, wait_ms=100)
    first = asyncio.ensure_future(acks.confirmed(_written(node)))
    await turns()
    waiting_old = asyncio.ensure_future(acks.confirmed(_written(node)))  # next round, old conn
    await turns()
    node.live = object()
    fresh = asyncio.ensure_future(acks.confirmed(_written(node)))  # a round on the new one
    await turns()
    assert await waiting_old is False  # its connection is gone: nothing to wait for
    node.waits[0].set_result(0)
    assert await first is False
    await turns()
    node.waits[1].set_result(1)
    assert await fresh is True


async def turns(count: int = 10) -> None:
    """Let the loop run what is ready ``count`` times over: ReplicaAcks schedules its steps
    with ``call_soon`` and the node here answers by hand (no timer, no I/O), so all it does in
    reaction has run by then, however slow the machine (a sleep of some milliseconds does not
    promise it), and a WAIT it has not sent by then it does not send."""
    for _ in range(count):
        await asyncio.sleep(0)
