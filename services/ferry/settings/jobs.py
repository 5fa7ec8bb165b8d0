"""The bulk jobs' limits, their completion windows parsed into seconds, and the list of roots
their items' URIs may name (``job_sources``)."""

from __future__ import annotations

from ferry.durations import parse_window
from ferry.errors import BadRequestError, ConfigError
from ferry.settings.fields import entries, refuse_duplicates

LONGEST_WINDOW_S = 10 ** 9  # what job_max_completion_window may be: no bound of its own


def check_job_limits(*, job_max_items: int, job_max_bytes: int, job_window: int,
                     job_max_unfinished: int, job_record_ttl_s: int, job_lease_s: float) -> None:
    """The jobs' limits are positive."""
    smallest = min(job_max_items, job_max_bytes, job_window, job_max_unfinished,
                   job_record_ttl_s)
    if smallest < 1 or job_lease_s <= 0:
        raise ConfigError("job_max_items, job_max_bytes, job_window, job_max_unfinished, "
                          "job_record_ttl_s and job_lease_s must be positive")


def job_windows(job_completion_window: str,
                job_max_completion_window: str) -> tuple[float, float]:
    """The default and the longest completion window, in seconds."""
    try:
        longest = parse_window(job_max_completion_window, 0, LONGEST_WINDOW_S)
        return parse_window(job_completion_window, 0, longest), longest
    except BadRequestError as exc:
        raise ConfigError(f"job_completion_window, job_max_completion_window: "
                          f"{exc.message}") from None


def check_job_sources(spec: str) -> None:
    """``job_sources``: roots, comma-separated, each once. What a root may be (file:/// or
    s3://) the jobs' ``Sources`` decides, when the gateway builds its jobs' parts: the
    settings sit below the jobs and do not import them."""
    roots = entries("job_sources", spec)
    for root in roots:
        if len(root.split()) > 1:
            raise ConfigError(f"job_sources: {root!r} has a space in it: roots are separated "
                              "by ',' (and a space in a path is written %20)")
    refuse_duplicates("job_sources", (root.rstrip("/") + "/" for root in roots))
