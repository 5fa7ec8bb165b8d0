"""Query strings of the ``/v1`` routes: each route names the parameters it takes and refuses any
other (``400 unknown_parameter``), as a JSON body refuses an unknown field, so that a misspelt
``?priorty=high`` is not served at normal priority without a word. A parameter given twice is
refused too (``400 invalid_parameter``) rather than one of its values chosen silently.

The protocol's ``/v2`` routes do not come here: Triton routes by the path alone and ignores any
query string, and its clients may add their own parameters (``tritonclient``'s
``query_params``), so ``/v2`` ignores them as Triton does (docs/oip.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from urllib.parse import unquote_plus

from ferry.errors import BadRequestError

MAX_SHOWN = 5  # names of unknown or repeated parameters quoted in one refusal


def parse_query(raw: bytes, accepted: frozenset[str], route: str) -> dict[str, str]:
    """The parameters of a raw query string (as ASGI gives it) by name, each one of
    ``accepted`` and given once; an empty value is a value (``?wait=`` is not "no wait").
    ``route`` (``"POST /v1/inference"``) names the route in a refusal."""
    if not raw:  # most requests: nothing to parse
        return {}
    return checked_query(query_pairs(raw.decode("latin-1")), accepted, route)


def query_pairs(text: str) -> list[tuple[str, str]]:
    """``urllib.parse.parse_qsl(text, keep_blank_values=True)``, for the hot routes at a fifth
    of its cost: only a piece with an escape (``%`` or ``+``) is unquoted."""
    pairs = []
    for piece in text.split("&"):
        if piece:
            name, _, value = piece.partition("=")
            if "%" in piece or "+" in piece:
                name, value = unquote_plus(name), unquote_plus(value)
            pairs.append((name, value))
    return pairs


def checked_query(pairs: Sequence[tuple[str, str]], accepted: frozenset[str],
                  route: str) -> dict[str, str]:
    """``pairs`` (name, value) by name, or a 400 for a name not in ``accepted`` or one given
    more than once."""
    query = dict(pairs)
    if not accepted.issuperset(query):
        unknown = sorted(set(query) - accepted)
        takes = f"takes {_names(accepted)}" if accepted else "takes no query parameters"
        raise BadRequestError("unknown_parameter", f"unknown query parameter(s) "
                              f"{_names(unknown)}; {route} {takes}")
    if len(query) != len(pairs):
        counts = Counter(name for name, _ in pairs)
        repeated = [name for name, count in counts.items() if count > 1]
        raise BadRequestError("invalid_parameter", f"query parameter(s) {_names(repeated)} "
                              f"given more than once; {route} takes each once")
    return query


def _names(names: Collection[str]) -> str:
    shown = sorted(names)[:MAX_SHOWN]
    more = f" and {len(names) - MAX_SHOWN} more" if len(names) > MAX_SHOWN else ""
    return ", ".join(repr(name) for name in shown) + more
