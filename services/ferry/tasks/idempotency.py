"""Idempotency keys: a repeat of a request with the same ``Idempotency-Key`` (per client) gets the
task the first one created, for 24 hours, also when the repeats race each other.

One key per (client, idempotency key), ``ferry:idem:<sha256>``, holding ``<task id> <request
digest>``. The first request sets it atomically (a Lua step: get it, or set it) before admitting
its task, so of any number of concurrent repeats exactly one admits and the rest learn its task
id. If that admission is refused (429, 503) the key is released again, so a retry is a first try.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from ferry import keys, lua
from ferry.errors import BadRequestError
from ferry.resp.client import Commands

TTL_S = 24 * 3600
MAX_KEY_LENGTH = 256

ADMITTED = "+"  # the key's third word once its task was admitted


def parse_idempotency_key(raw: str | None) -> str | None:
    """An ``Idempotency-Key`` header's (or metadata's) value: 1 to 256 printable ASCII
    characters, or a 400."""
    if raw is None:
        return None
    if not 0 < len(raw) <= MAX_KEY_LENGTH or not (raw.isascii() and raw.isprintable()):
        raise BadRequestError("invalid_idempotency_key", "Idempotency-Key must be 1 to "
                              f"{MAX_KEY_LENGTH} printable ASCII characters")
    return raw


@dataclass(frozen=True)
class Claimed:
    """A key's holder: the task the first request created, that request's digest, and whether
    the task was admitted (a task that was, and whose record has expired since, is still the
    key's task: its repeat gets its id, never a second inference)."""

    task_id: str
    digest: str
    admitted: bool = False

    @property
    def value(self) -> str:
        return f"{self.task_id} {self.digest}" + (f" {ADMITTED}" if self.admitted else "")


class ClaimKeys(NamedTuple):
    key: str


class ClaimArgs(NamedTuple):
    holder: str  # "<task id> <digest>"
    ttl: int


class SwapKeys(NamedTuple):
    key: str


class SwapArgs(NamedTuple):
    expected: str  # a ``Claimed.value``
    replacement: str  # '' : delete the key


class Swap(IntEnum):
    """What the swap script did with a key."""

    DONE = 1  # it held the expected value: replaced (or deleted)
    NOT_HELD = 0  # it held another, or none: left alone


CLAIM = lua.ScriptSpec("ferry.tasks", "idempotency_claim", ClaimKeys._fields, ClaimArgs._fields)
SWAP = lua.ScriptSpec("ferry.tasks", "idempotency_swap", SwapKeys._fields, SwapArgs._fields,
                      results=(Swap, "SWAP_"))


def holder(reply: Any) -> Claimed | None:
    """The claim script's answer: who holds the key (None: the request that asked, now)."""
    if reply is None:
        return None
    task_id, _, rest = bytes(reply).decode().partition(" ")
    digest, _, mark = rest.partition(" ")
    return Claimed(task_id, digest, mark == ADMITTED)


def redis_key(client_id: str, key: str) -> str:
    scope = hashlib.sha256(f"{len(client_id)}:{client_id}\0{key}".encode()).hexdigest()
    return f"{keys.PREFIX}:idem:{scope}"


def request_digest(model: str, priority: int, content_type: str, payload: bytes,
                   version: str = "") -> str:
    """What makes two requests 'the same body' (the version they pin is part of it)."""
    pinned = f"@{version}" if version else ""
    head = f"{model}{pinned}\0{priority}\0{content_type}\0".encode()
    return hashlib.sha256(head + payload).hexdigest()


class IdempotencyKeys:
    def __init__(self, client: Commands, ttl_s: int = TTL_S) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self._claim = client.register_script(lua.source(CLAIM))
        self._swap = client.register_script(lua.source(SWAP))

    async def claim(self, key: str, task_id: str, digest: str) -> Claimed | None:
        """Take ``key`` for ``task_id``; None if taken now, else who holds it."""
        return holder(await self.client.execute(*self._claim.command(
            ClaimKeys(key=key), ClaimArgs(holder=Claimed(task_id, digest).value,
                                          ttl=self.ttl_s))))

    async def replace(self, key: str, old: Claimed, task_id: str, digest: str) -> bool:
        """Hand a key whose task never came to be over to ``task_id`` (if still ``old``'s)."""
        return await self._swapped(key, old, Claimed(task_id, digest).value) is Swap.DONE

    async def confirm(self, key: str, task_id: str, digest: str) -> None:
        """Mark the key's task admitted: from now on it is the key's task for good."""
        await self._swapped(key, Claimed(task_id, digest),
                            Claimed(task_id, digest, admitted=True).value)

    async def release(self, key: str, task_id: str, digest: str) -> None:
        """Give up a key this request took, whose task was not admitted."""
        await self._swapped(key, Claimed(task_id, digest), "")

    async def _swapped(self, key: str, expected: Claimed, replacement: str) -> Swap:
        return Swap(int(await self.client.execute(*self._swap.command(
            SwapKeys(key=key), SwapArgs(expected=expected.value, replacement=replacement)))))
