"""Which priorities a batcher reads: normal always, others while rung, and every one of them
polled now and then (a doorbell can wait behind a normal backlog)."""

from __future__ import annotations

from ferry.priority import Priority
from ferry.queue.redis_streams import AWAKE_S, SLEEPING_POLL_S, RedisStreamQueue
from ferry.resp.client import RedisAddress, RespClient


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


ALL = [Priority.HIGH, Priority.NORMAL, Priority.LOW, Priority.BATCH]


def test_sleeping_priorities_are_polled_but_stay_asleep() -> None:
    clock = Clock()
    queue = RedisStreamQueue(RespClient(RedisAddress()), RespClient(RedisAddress()), partitions=2,
                             owned=(0, 1), consumer="c", clock=clock)
    assert queue.awake() == ALL  # at first: all
    clock.now += AWAKE_S + 0.1
    assert queue.awake() == [Priority.NORMAL]
    assert queue.awake(poll=True) == ALL
    assert queue.awake(poll=True) == [Priority.NORMAL]  # polled a moment ago
    clock.now += SLEEPING_POLL_S
    assert queue.awake(poll=True) == ALL
    assert queue.awake([Priority.LOW], poll=True) == [Priority.NORMAL, Priority.LOW]  # held
