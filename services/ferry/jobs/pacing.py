"""How much of its window a job may fill, by how busy interactive traffic keeps its model.
Pure code, no I/O.

Job items wait behind every interactive priority, but a batch of them already at Triton makes
an interactive request that arrives meanwhile wait for it (one batch time, at most). While the
model keeps up, that is all a job costs interactive traffic. When interactive work queues up
(its latency rises), feeding steps back: interactive work waiting under ``CALM_BATCHES`` batch
times, the whole window; over ``BUSY_BATCHES``, nothing new is fed (items in flight finish);
linearly between.
"""

from __future__ import annotations

import math

CALM_BATCHES = 2.0
BUSY_BATCHES = 4.0
MIN_BATCH_S = 0.010  # a model whose batch time is not measured yet


def feed_share(interactive: int, rate: float, batch_s: float) -> float:
    """The share (0 to 1) of its window a job may fill, with ``interactive`` tasks of its model
    unfinished, the model serving ``rate`` tasks a second in batches of ``batch_s``."""
    if interactive <= 0 or rate <= 0:
        return 1.0
    wait_s = interactive / rate
    batch_s = max(batch_s, MIN_BATCH_S)
    calm, busy = CALM_BATCHES * batch_s, BUSY_BATCHES * batch_s
    if wait_s <= calm:
        return 1.0
    if wait_s >= busy:
        return 0.0
    return (busy - wait_s) / (busy - calm)


def window_room(window: int, share: float, in_flight: int) -> int:
    """How many more items may be fed: the window scaled by ``share``, less those in flight."""
    return max(0, math.floor(window * share) - in_flight)
