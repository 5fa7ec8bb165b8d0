"""When a parked reader reads ahead for the next batch, and when what it read is fresh enough to
leave the moment a slot frees.

While every slot is busy the reader parks (reading then would cost a round trip per task and
help no batch leave sooner). If it only read once a slot freed, the slot would idle for that
read: the dispatch gap. So it reads once just before the first batch at Triton is expected to
end (its launch plus the fitted t(B)), ``lead`` ahead of it, and the next batch leaves as soon
as the slot frees, with what was queued a few milliseconds earlier; what arrived since rides
the batch after, as it would behind Triton's own queue. A call that runs late is read for again
before what was read goes stale, a few times at most; a read-ahead that is stale when the slot
frees (or none at all) leaves the old order: read first, then plan.

Pure: times are the batcher's monotonic clock, in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable

LEAD_MIN_S = 0.001
LEAD_MAX_S = 0.004  # with FRESH_S: a high-priority task misses the next batch by at most this
FRESH_S = 0.005  # a read-ahead this recent (from its start) may leave without a read after it
READS_PER_STRETCH = 4  # read-aheads while every slot stays busy: a call far past its fit waits
READ_S_INITIAL = 0.002
READ_S_WEIGHT = 0.2  # of the newest read in the reads' moving average


def lead(read_s: float) -> float:
    """How long before a slot is expected to free the read-ahead starts: the reads' typical
    duration and a millisecond, within [LEAD_MIN_S, LEAD_MAX_S]."""
    return min(LEAD_MAX_S, max(LEAD_MIN_S, read_s + 0.001))


def average(read_s: float, latest_s: float) -> float:
    """The reads' moving average, with the latest read's duration."""
    return read_s + READ_S_WEIGHT * (latest_s - read_s)


def next_read(ends: Iterable[float], lead_s: float, last: float | None, reads: int
              ) -> float | None:
    """When to read ahead: ``lead_s`` before the first expected end of a batch at Triton; once
    read for it (``last``: when the latest read-ahead started), again just before that read goes
    stale. None: no end is known, or this stretch has had its ``READS_PER_STRETCH``."""
    first = min(ends, default=None)
    if first is None or reads >= READS_PER_STRETCH:
        return None
    at = first - lead_s
    if last is not None and last >= at:
        return last + FRESH_S - lead_s
    return at


def fresh(last: float | None, now: float) -> bool:
    """Whether the latest read-ahead (from its start) is recent enough for the next batch to
    leave without reading again."""
    return last is not None and 0.0 <= now - last <= FRESH_S
