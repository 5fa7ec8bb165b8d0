"""Tensor batches counted in rows: which requests share one call to a model.

A tensor request of ``n`` rows counts ``n`` against its model's ``max_batch_size``. The policy
fills a batch by requests; before the call, the batch is cut, in order, into runs whose rows fit
the model. Pure code.
"""

from __future__ import annotations

from collections.abc import Sequence


def row_chunks(rows: Sequence[int], limit: int) -> list[range]:
    """Consecutive runs of the requests (by index), greedy in order, each holding at most
    ``limit`` rows; a request over the limit goes alone (the model refuses it, not its mates).
    A ``limit`` of 0 (a model that does not batch) sends one request per call."""
    chunks: list[range] = []
    start = total = 0
    for index, count in enumerate(rows):
        if index > start and (limit <= 0 or total + count > limit):
            chunks.append(range(start, index))
            start, total = index, 0
        total += count
    if rows:
        chunks.append(range(start, len(rows)))
    return chunks
