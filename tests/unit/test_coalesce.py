"""The coalescer that carries many admissions to one Redis call: no timer, one call out per
group, each caller answered on its own (pure logic: the sender is a function here)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest

from ferry.resp.coalesce import Coalescer


class Sender:
    """Answers each item with its double, once the test lets the call land; records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Hashable, list[int]]] = []
        self.land = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self, group: Hashable, items: list[int]) -> list[int | Exception]:
        self.calls.append((group, items))
        await self.land.wait()
        if self.fail is not None:
            raise self.fail
        return [ValueError(f"bad {i}") if i < 0 else 2 * i for i in items]


async def turns() -> None:
    """A few turns of the event loop: the caller's, then the call's own task."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_first_goes_at_once_and_those_that_come_meanwhile_ride_the_next_call() -> None:
    sender = Sender()
    coalescer = Coalescer(sender)
    first = asyncio.ensure_future(coalescer.call("g", 1))
    await turns()
    assert sender.calls == [("g", [1])]  # no timer: it went at once, alone
    rest = [asyncio.ensure_future(coalescer.call("g", i)) for i in range(2, 7)]
    await turns()
    assert len(sender.calls) == 1  # one call out per group: the others wait
    sender.land.set()
    assert await first == 2
    assert await asyncio.gather(*rest) == [4, 6, 8, 10, 12]
    assert sender.calls == [("g", [1]), ("g", [2, 3, 4, 5, 6])]  # in the order they came
    assert (coalescer.calls, coalescer.items) == (2, 6)


async def test_groups_go_apart_and_at_once() -> None:
    sender = Sender()
    coalescer = Coalescer(sender)
    calls = [asyncio.ensure_future(coalescer.call(group, i))
             for i, group in enumerate(["a", "b", "a", "b"])]
    await turns()
    assert sender.calls == [("a", [0]), ("b", [1])]
    sender.land.set()
    assert await asyncio.gather(*calls) == [0, 2, 4, 6]
    assert sorted(sender.calls[2:]) == [("a", [2]), ("b", [3])]


async def test_an_items_error_is_its_own_and_a_calls_error_is_everyones() -> None:
    sender = Sender()
    sender.land.set()
    coalescer = Coalescer(sender)
    results = await asyncio.gather(coalescer.call("g", 1), coalescer.call("g", -1),
                                   coalescer.call("g", 3), return_exceptions=True)
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad -1"
    sender.fail = ConnectionError("Redis went away")
    failed = await asyncio.gather(coalescer.call("g", 1), coalescer.call("g", 2),
                                  return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in failed)
    sender.fail = None
    assert await coalescer.call("g", 5) == 10  # and the next call goes as ever


async def test_a_cancelled_caller_leaves_the_others_answered() -> None:
    sender = Sender()
    coalescer = Coalescer(sender)
    first = asyncio.ensure_future(coalescer.call("g", 1))
    await turns()
    gone = asyncio.ensure_future(coalescer.call("g", 2))
    kept = asyncio.ensure_future(coalescer.call("g", 3))
    await turns()
    gone.cancel()
    sender.land.set()
    assert await first == 2
    assert await kept == 6
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert sender.calls[1] == ("g", [3])  # it left before its call: its item never went


async def test_a_call_whose_callers_all_left_is_not_sent() -> None:
    sender = Sender()
    coalescer = Coalescer(sender)
    first = asyncio.ensure_future(coalescer.call("g", 1))
    await turns()
    gone = [asyncio.ensure_future(coalescer.call("g", i)) for i in (2, 3)]
    await turns()
    for caller in gone:
        caller.cancel()
    sender.land.set()
    assert await first == 2
    await turns()
    assert sender.calls == [("g", [1])]
    assert await coalescer.call("g", 4) == 8  # and the group goes on


async def test_a_call_carries_about_max_bytes_and_at_least_one_item() -> None:
    sender = Sender()
    coalescer = Coalescer(sender, size=lambda item: item, max_bytes=10)
    first = asyncio.ensure_future(coalescer.call("g", 50))  # over the budget alone: it goes
    await turns()
    rest = [asyncio.ensure_future(coalescer.call("g", i)) for i in (4, 4, 4, 30, 1)]
    sender.land.set()
    assert await first == 100
    assert await asyncio.gather(*rest) == [8, 8, 8, 60, 2]
    assert [items for _, items in sender.calls] == [[50], [4, 4, 4], [30], [1]]


async def test_a_failure_while_answering_reaches_every_caller() -> None:
    land = asyncio.Event()

    async def short(group: Hashable, items: list[int]) -> list[int | Exception]:
        await land.wait()
        return [1]  # one reply for several items: a bug, said to every caller

    coalescer: Coalescer[int, int] = Coalescer(short)
    first = asyncio.ensure_future(coalescer.call("g", 0))
    await turns()
    rest = [asyncio.ensure_future(coalescer.call("g", i)) for i in (1, 2)]
    land.set()
    assert await first == 1
    results = await asyncio.gather(*rest, return_exceptions=True)
    assert results[0] == 1  # the one reply there is; the caller without one is not left
    assert isinstance(results[1], ValueError)  # hanging: zip(strict=True)'s error is its


async def test_a_call_carries_at_most_max_items() -> None:
    sender = Sender()
    coalescer = Coalescer(sender, max_items=3)
    first = asyncio.ensure_future(coalescer.call("g", 0))
    await turns()
    rest = [asyncio.ensure_future(coalescer.call("g", i)) for i in range(1, 8)]
    sender.land.set()
    assert await first == 0
    assert await asyncio.gather(*rest) == [2 * i for i in range(1, 8)]
    assert [items for _, items in sender.calls] == [[0], [1, 2, 3], [4, 5, 6], [7]]
