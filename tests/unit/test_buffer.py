"""The boarding buffer: per-lane FIFO queues with arrival times."""

from __future__ import annotations

from ferry.rules.buffer import Boarded, BoardingBuffer
from ferry.rules.policy import Lane, Waiting

A, B, M = Lane("a"), Lane("b"), Lane("m")
SUSPECT_A = Lane("a", suspect=True)


def test_new_buffer_is_empty() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    assert len(buffer) == 0
    assert buffer.lanes() == []
    assert list(buffer.views(lambda _: 8)) == []
    assert buffer.take(M, 5) == []


def test_len_counts_items_over_all_lanes() -> None:
    buffer: BoardingBuffer[int] = BoardingBuffer()
    buffer.add(A, 1, 1.0)
    buffer.add(B, 2, 2.0)
    buffer.add(A, 3, 3.0)
    assert len(buffer) == 3
    assert buffer.lanes() == [A, B]


def test_take_is_fifo_per_lane() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    for i in range(5):
        buffer.add(A, f"a{i}", float(i))
        buffer.add(B, f"b{i}", float(i) + 0.5)
    assert buffer.take(A, 2) == ["a0", "a1"]
    assert buffer.take(B, 3) == ["b0", "b1", "b2"]
    assert buffer.take(A, 2) == ["a2", "a3"]
    assert len(buffer) == 3


def test_take_more_than_waiting_returns_all_and_forgets_the_lane() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "x", 1.0)
    buffer.add(A, "y", 2.0)
    buffer.add(B, "z", 3.0)
    assert buffer.take(A, 10) == ["x", "y"]
    assert buffer.lanes() == [B]
    assert len(buffer) == 1
    assert buffer.take(A, 1) == []


def test_take_zero_leaves_the_queue_alone() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "x", 1.0)
    assert buffer.take(A, 0) == []
    assert buffer.lanes() == [A]
    assert len(buffer) == 1


def test_take_unknown_lane_returns_nothing() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "x", 1.0)
    assert buffer.take(Lane("other"), 3) == []
    assert len(buffer) == 1


def test_views_report_count_oldest_newest_and_capacity() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "a0", 5.0)
    buffer.add(A, "a1", 6.0)
    buffer.add(B, "b0", 7.0)
    views = list(buffer.views(lambda lane: {A: 16}.get(lane, 4)))
    assert views == [Waiting(A, 2, 5.0, 6.0, 16), Waiting(B, 1, 7.0, 7.0, 4)]


def test_views_oldest_moves_after_take() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "a0", 5.0)
    buffer.add(A, "a1", 6.0)
    buffer.add(A, "a2", 9.0)
    assert buffer.take(A, 1) == ["a0"]
    assert list(buffer.views(lambda _: 8)) == [Waiting(A, 2, 6.0, 9.0, 8)]


def test_lane_re_added_after_emptied() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "first", 1.0)
    assert buffer.take(A, 1) == ["first"]
    buffer.add(A, "second", 2.0)
    assert list(buffer.views(lambda _: 8)) == [Waiting(A, 1, 2.0, 2.0, 8)]
    assert buffer.take(A, 1) == ["second"]


def test_boarded_holds_item_and_arrival() -> None:
    boarded = Boarded(item="x", arrived=1.5)
    assert boarded.item == "x"
    assert boarded.arrived == 1.5


def test_drain_empties_every_queue_oldest_first() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "a1", 1.0)
    buffer.add(B, "b1", 2.0)
    buffer.add(A, "a2", 3.0)
    assert buffer.drain() == ["a1", "a2", "b1"]
    assert len(buffer) == 0 and buffer.lanes() == []


def test_a_models_suspect_lane_is_its_own_queue() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "normal", 1.0)
    buffer.add(SUSPECT_A, "suspect", 2.0)
    assert buffer.lanes() == [A, SUSPECT_A]
    assert buffer.take(SUSPECT_A, 5) == ["suspect"]
    assert buffer.take(A, 5) == ["normal"]


def test_remove_takes_the_chosen_items_from_every_lane() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    for item, lane in (("a1", A), ("x", A), ("b1", B), ("x2", B), ("x3", SUSPECT_A)):
        buffer.add(lane, item, 0.0)
    assert sorted(buffer.remove(lambda item: item.startswith("x"))) == ["x", "x2", "x3"]
    assert buffer.take(A, 9) == ["a1"] and buffer.take(B, 9) == ["b1"]
    assert SUSPECT_A not in buffer.lanes() and len(buffer) == 0
    assert buffer.remove(lambda item: True) == []


def test_each_lane_shows_the_policy_its_earliest_due_time() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer()
    buffer.add(A, "no deadline", 1.0)
    buffer.add(A, "slo", 2.0, due=2.4)
    buffer.add(A, "tight deadline", 2.1, due=2.2)
    buffer.add(B, "plain", 1.0)
    due = {view.lane: view.due for view in buffer.views(lambda _: 8)}
    assert due == {A: 2.2, B: None}
    assert buffer.take(A, 2) == ["no deadline", "slo"]
    assert next(buffer.views(lambda _: 8)).due == 2.2
    assert buffer.remove(lambda item: item == "tight deadline") == ["tight deadline"]
    assert [v.due for v in buffer.views(lambda _: 8)] == [None]
    buffer.add(A, "again", 5.0, due=5.3)
    buffer.take(A, 1)
    buffer.add(A, "later", 6.0)
    assert {v.lane: v.due for v in buffer.views(lambda _: 8)}[A] is None


def test_a_batch_of_a_lane_with_several_flows_takes_them_in_turns() -> None:
    """More than a batch of several clients' items: each client's first, then each one's
    second, ..., in arrival order within the batch; the rest keep their order."""
    buffer: BoardingBuffer[str] = BoardingBuffer(flow=lambda item: item[0])
    lane = Lane("m")
    for i, item in enumerate(["a1", "a2", "a3", "a4", "b1", "a5", "c1", "b2"]):
        buffer.add(lane, item, float(i))
    assert buffer.take(lane, 4) == ["a1", "a2", "b1", "c1"]
    assert buffer.take(lane, 2) == ["a3", "b2"]
    assert buffer.take(lane, 5) == ["a4", "a5"]
    assert len(buffer) == 0


def test_one_flow_or_a_batch_that_takes_all_is_first_come_first_served() -> None:
    buffer: BoardingBuffer[str] = BoardingBuffer(flow=lambda item: item[0])
    lane = Lane("m")
    for i, item in enumerate(["a1", "a2", "a3", "a4"]):
        buffer.add(lane, item, float(i))
    assert buffer.take(lane, 2) == ["a1", "a2"]
    buffer.add(lane, "b1", 5.0)
    assert buffer.take(lane, 3) == ["a3", "a4", "b1"]  # all of it: in arrival order
    buffer.add(lane, "b2", 6.0)
    buffer.add(lane, "c1", 7.0)
    assert buffer.remove(lambda item: item == "c1") == ["c1"]
    buffer.add(lane, "b3", 8.0)
    assert buffer.take(lane, 1) == ["b2"]  # b's alone again: its oldest


def test_an_item_that_arrived_before_the_lanes_last_boards_in_front_of_later_ones() -> None:
    """A task another batcher held (a rider) boards as of when it was enqueued: in front of
    what came after it, so the batch takes it first and the lane's oldest is its oldest."""
    buffer: BoardingBuffer[str] = BoardingBuffer()
    for name, arrived in (("own-1", 1.0), ("own-2", 2.0), ("own-3", 3.0)):
        buffer.add(A, name, arrived)
    buffer.add(A, "rider-old", 0.5)
    buffer.add(A, "rider-mid", 2.5)
    buffer.add(A, "same-time", 3.0)  # as late as the last: after it
    (view,) = buffer.views(lambda _: 8)
    assert (view.oldest, view.newest) == (0.5, 3.0)
    assert buffer.take(A, 3) == ["rider-old", "own-1", "own-2"]
    assert buffer.take(A, 3) == ["rider-mid", "own-3", "same-time"]
