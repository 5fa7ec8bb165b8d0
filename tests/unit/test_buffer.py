"""The boarding buffer: per-model FIFO queues with arrival times."""

from __future__ import annotations

from ferry.batching.buffer import Boarded, BoardingBuffer
from ferry.batching.policy import Waiting


def test_new_buffer_is_empty() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    assert len(buffer) == 0
    assert buffer.models() == []
    assert list(buffer.views(lambda _: 8)) == []
    assert buffer.take("m", 5) == []


def test_len_counts_items_over_all_models() -> None:
    buffer: BoardingBuffer[int] = BoardingBuffer()
    buffer.add("a", 1, 1.0)
    buffer.add("b", 2, 2.0)
    buffer.add("a", 3, 3.0)
    assert len(buffer) == 3
    assert buffer.models() == ["a", "b"]


def test_take_is_fifo_per_model() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    for i in range(5):
        buffer.add("a", f"a{i}", float(i))
        buffer.add("b", f"b{i}", float(i) + 0.5)
    assert buffer.take("a", 2) == ["a0", "a1"]
    assert buffer.take("b", 3) == ["b0", "b1", "b2"]
    assert buffer.take("a", 2) == ["a2", "a3"]
    assert len(buffer) == 3


def test_take_more_than_waiting_returns_all_and_forgets_the_model() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add("a", "x", 1.0)
    buffer.add("a", "y", 2.0)
    buffer.add("b", "z", 3.0)
    assert buffer.take("a", 10) == ["x", "y"]
    assert buffer.models() == ["b"]
    assert len(buffer) == 1
    assert buffer.take("a", 1) == []


def test_take_zero_leaves_the_queue_alone() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add("a", "x", 1.0)
    assert buffer.take("a", 0) == []
    assert buffer.models() == ["a"]
    assert len(buffer) == 1


def test_take_unknown_model_returns_nothing() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add("a", "x", 1.0)
    assert buffer.take("other", 3) == []
    assert len(buffer) == 1


def test_views_report_count_oldest_and_capacity() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add("a", "a0", 5.0)
    buffer.add("a", "a1", 6.0)
    buffer.add("b", "b0", 7.0)
    views = list(buffer.views(lambda key: {"a": 16}.get(key, 4)))
    assert views == [Waiting("a", 2, 5.0, 16), Waiting("b", 1, 7.0, 4)]


def test_views_oldest_moves_after_take() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add("a", "a0", 5.0)
    buffer.add("a", "a1", 6.0)
    buffer.add("a", "a2", 9.0)
    assert buffer.take("a", 1) == ["a0"]
    assert list(buffer.views(lambda _: 8)) == [Waiting("a", 2, 6.0, 8)]


def test_model_re_added_after_emptied() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add("a", "first", 1.0)
    assert buffer.take("a", 1) == ["first"]
    buffer.add("a", "second", 2.0)
    assert list(buffer.views(lambda _: 8)) == [Waiting("a", 1, 2.0, 8)]
    assert buffer.take("a", 1) == ["second"]


def test_boarded_holds_item_and_arrival() -> None:
    boarded = Boarded(item="x", arrived=1.5)
    assert boarded.item == "x"
    assert boarded.arrived == 1.5


def test_drain_empties_every_queue_oldest_first() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add("a", "a1", 1.0)
    buffer.add("b", "b1", 2.0)
    buffer.add("a", "a2", 3.0)
    assert buffer.drain() == ["a1", "a2", "b1"]
    assert len(buffer) == 0 and buffer.models() == []
