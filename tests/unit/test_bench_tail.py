"""The light-load tail tool's summary (``loadtest.bench.tail``): percentiles, then the slowest
requests with their latency split."""

from __future__ import annotations

from loadtest.bench.tail import Answered, summary


def test_the_summary_gives_percentiles_and_splits_the_slowest() -> None:
    answered = [Answered(float(ms), 0.1, 0.5, ms - 1.0, 0.4, "SUCCESS") for ms in range(1, 1001)]
    answered.append(Answered(40.0, 20.0, 20.5, 19.0, 0.5, "FAILED"))
    lines = summary("tree", answered, 2)
    assert lines[0] == ("tree: 1001 requests (1 not SUCCESS): p50 500.0, p99 990.0, "
                        "p99.9 999.0, max 1000.0 ms")
    assert lines[1].startswith("  1000.0 ms: client late   0.1, to admission   0.5, queue and "
                               "Triton 999.0, to the answer   0.4 (SUCCESS)")
    assert len(lines) == 3
