"""Retry delays: exponential, capped, with jitter supplied by the caller (so tests are exact)."""


def backoff_delay(attempt: int, base_s: float, max_s: float, jitter: float) -> float:
    """Delay before retry number ``attempt`` (1 = the first retry).

    ``base_s * 2**(attempt-1)``, capped at ``max_s``, then scaled into [50%, 100%] by ``jitter``
    in [0, 1) so that batchers retrying together spread out.
    """
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    ceiling = min(max_s, base_s * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + 0.5 * min(max(jitter, 0.0), 1.0))
