"""What the batcher's loops share (``ferry.batcher.shared``), without servers: the work aboard
and its held entries, whom a freed slot wakes by the reader's pace, and how a batch done at
Triton makes way for the loop its slot woke before it builds its answers."""

from __future__ import annotations

import asyncio

from ferry.batcher.shared import Aboard, AtTriton, ReadAhead, Signals
from ferry.priority import Priority
from ferry.queue.base import Delivery
from ferry.rules.policy import Lane
from ferry.v1.task_pb2 import Task

LANE = Lane("m", Priority.NORMAL)


def delivery(name: str) -> Delivery:
    return Delivery(0, "s", f"{name}-0", b"", Task(task_id=name, model="m", payload=b"x"))


def test_a_batch_taken_stays_held_until_let_go_and_a_cancelled_boarded_task_leaves() -> None:
    aboard = Aboard()
    first, second, third = delivery("a"), delivery("b"), delivery("c")
    for each in (first, second, third):
        aboard.board(LANE, each, 0.0, None)
    assert aboard.take(LANE, 1) == [first]
    assert aboard.is_held(first) and len(aboard) == 2  # at Triton: kept alive
    aboard.let_go([first])
    assert not aboard.is_held(first)
    assert aboard.cancel("b") == [second] and aboard.cancelled(second)
    assert aboard.cancel("elsewhere") == []  # held by another batcher: remembered all the same
    aboard.cancel_settled([second], settled=True)
    assert not aboard.is_held(second) and not aboard.cancelled(second)
    assert aboard.held() == [third.key] and aboard.drain() == [third]


def pace(clock: list[float]) -> tuple[Signals, ReadAhead]:
    signals = Signals()
    return signals, ReadAhead(signals, AtTriton(), lambda: clock[0])


def test_a_freed_slot_wakes_the_dispatcher_while_the_reader_is_awake_not_while_it_reads_ahead(
) -> None:
    async def scenario() -> None:
        signals, read_ahead = pace([10.0])
        assert read_ahead.slot_freed()
        assert await signals.changed(0)  # the dispatcher plans
        signals.planning()
        read_ahead.reading()
        assert not read_ahead.slot_freed()  # what it reads boards, and that wakes the dispatcher
        assert not await signals.changed(0)

    asyncio.run(scenario())


def test_a_parked_reader_wakes_for_a_freed_slot_after_the_dispatcher_when_it_read_ahead() -> None:
    async def scenario() -> None:
        clock = [10.0]
        signals, read_ahead = pace(clock)
        parked = asyncio.create_task(read_ahead.park(30.0))
        await asyncio.sleep(0)
        assert read_ahead.parked and read_ahead.slot_freed()
        assert not await signals.changed(0)  # nothing read ahead: the reader reads first
        assert await parked and not read_ahead.parked
        read_ahead.read(read_ahead.reading())
        read_ahead.done()
        parked = asyncio.create_task(read_ahead.park(30.0))
        await asyncio.sleep(0)
        assert read_ahead.slot_freed()
        assert await signals.changed(0)  # what was read ahead leaves first
        assert await parked

    asyncio.run(scenario())


def test_a_batch_that_made_way_goes_on_after_the_batch_launched_before_the_way_was_made() -> None:
    async def scenario() -> list[str]:
        signals, order = Signals(), list[str]()
        way = signals.make_way()

        async def done_at_triton() -> None:
            await way
            order.append("answers built")

        async def next_batch() -> None:
            order.append("call sent")

        waiting = asyncio.create_task(done_at_triton())
        await asyncio.sleep(0)
        assert order == []  # it waits for the dispatcher's round
        launched = asyncio.create_task(next_batch())  # the round launches the next batch,
        signals.way_made()  # and ends
        await asyncio.gather(waiting, launched)
        return order

    assert asyncio.run(scenario()) == ["call sent", "answers built"]


def test_a_batch_that_made_way_for_a_parked_reader_goes_on_once_the_reader_has_read() -> None:
    async def scenario() -> list[str]:
        signals, read_ahead = pace([10.0])
        order: list[str] = []

        async def reader() -> None:
            await read_ahead.park(30.0)
            order.append("read sent")  # the reader's next step, before it awaits Redis

        async def done_at_triton() -> None:
            assert read_ahead.slot_freed()  # it woke the parked reader
            await signals.make_way()
            order.append("answers built")

        parked = asyncio.create_task(reader())
        await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(done_at_triton(), parked), 30.0)
        return order

    assert asyncio.run(scenario()) == ["read sent", "answers built"]
