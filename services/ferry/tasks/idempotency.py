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

from ferry import keys
from ferry.resp.client import Commands

TTL_S = 24 * 3600
MAX_KEY_LENGTH = 256

# KEYS: the idempotency key. ARGV: "<task id> <digest>", TTL. Returns the value already there, or
# nil after setting it.
_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return false
"""

# KEYS: the idempotency key. ARGV: the value this request set, the value to set instead ('': none).
_SWAP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
"""


ADMITTED = "+"  # the key's third word once its task was admitted


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
        self._claim = client.register_script(_CLAIM)
        self._swap = client.register_script(_SWAP)

    async def claim(self, key: str, task_id: str, digest: str) -> Claimed | None:
        """Take ``key`` for ``task_id``; None if taken now, else who holds it."""
        held = await self.client.execute(*self._claim.command([key],
                                                              [f"{task_id} {digest}",
                                                               self.ttl_s]))
        if held is None:
            return None
        holder, _, rest = bytes(held).decode().partition(" ")
        held_digest, _, mark = rest.partition(" ")
        return Claimed(holder, held_digest, mark == ADMITTED)

    async def replace(self, key: str, old: Claimed, task_id: str, digest: str) -> bool:
        """Hand a key whose task never came to be over to ``task_id`` (if still ``old``'s)."""
        swapped = await self.client.execute(*self._swap.command(
            [key], [old.value, f"{task_id} {digest}"]))
        return bool(swapped)

    async def confirm(self, key: str, task_id: str, digest: str) -> None:
        """Mark the key's task admitted: from now on it is the key's task for good."""
        claimed = Claimed(task_id, digest)
        await self.client.execute(*self._swap.command(
            [key], [claimed.value, Claimed(task_id, digest, admitted=True).value]))

    async def release(self, key: str, task_id: str, digest: str) -> None:
        """Give up a key this request took, whose task was not admitted."""
        await self.client.execute(*self._swap.command([key], [f"{task_id} {digest}", ""]))
