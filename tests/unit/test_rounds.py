"""A loop's round counter: a wait ends with the first round begun after it, never earlier."""

from __future__ import annotations

import asyncio

import pytest

from ferry.batcher.shared import Rounds


async def test_a_round_under_way_when_the_wait_begins_does_not_end_it() -> None:
    rounds, step, first_ended = Rounds(), asyncio.Event(), asyncio.Event()

    async def loop() -> None:
        for _ in range(2):
            with rounds.round():
                await step.wait()
            step.clear()
            first_ended.set()

    running = asyncio.create_task(loop())
    await asyncio.sleep(0)  # the loop runs up to its first step
    assert (rounds.started, rounds.ended) == (1, 0)
    waiting = asyncio.create_task(rounds.next(timeout_s=5))
    await asyncio.sleep(0)  # the wait begins
    step.set()
    await first_ended.wait()
    await asyncio.sleep(0)  # the wait has seen the first round end
    assert rounds.ended == 1 and not waiting.done()
    step.set()  # the second round, begun after the wait, ends
    await asyncio.wait_for(waiting, 5)
    await running
    assert (rounds.started, rounds.ended) == (2, 2)


async def test_a_round_that_fails_still_ends() -> None:
    rounds = Rounds()
    waiting = asyncio.create_task(rounds.next(timeout_s=5))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError), rounds.round():
        raise RuntimeError("Redis went away")
    await asyncio.wait_for(waiting, 5)


async def test_no_round_is_a_timeout() -> None:
    with pytest.raises(TimeoutError):
        await Rounds().next(timeout_s=0.01)
