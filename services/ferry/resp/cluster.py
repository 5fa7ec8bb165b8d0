"""The lean client over a Redis Cluster: one pipelined connection per master, commands routed by
the hash slot of their key.

Ferry keeps everything of one task, and of one partition, in one slot (``{pN}`` hash tags), so a
command or script never spans slots. A pipeline is split by node and sent to every node at once;
replies come back in the caller's order. ``MOVED`` (a slot changed owner) refreshes the slot map
and sends the command again; ``ASK`` (a slot being migrated) sends it once to the new owner after
``ASKING``. Both mean the command had no effect where it was refused, so sending it again is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from redis.crc import key_slot

from ferry.errors import ConfigError, RedisCommandError, RedisUnavailableError
from ferry.resp.client import (
    Arg,
    Command,
    Packed,
    RedisAddress,
    RespClient,
    RespConnectionError,
    Script,
    as_bytes,
    raise_first,
)

SLOTS = 16384
MAX_REDIRECTS = 5  # MOVED/ASK rounds for one command before giving up (a cluster in flux)
REFRESH_HOLD_S = 0.5  # after a connection error, the slot map is asked again at most this often

# Commands whose first argument is not a key: sent to any node.
_KEYLESS = frozenset({b"PING", b"INFO", b"CLIENT", b"SCRIPT", b"PUBLISH", b"CLUSTER", b"TIME",
                      b"ECHO", b"ASKING", b"FUNCTION", b"CONFIG", b"DBSIZE", b"FLUSHALL"})
_SCRIPTS = frozenset({b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL", b"FCALL_RO"})
_STREAM_READS = frozenset({b"XREAD", b"XREADGROUP"})
_KEY_AFTER_SUBCOMMAND = frozenset({b"XGROUP", b"XINFO", b"OBJECT", b"MEMORY"})  # XGROUP CREATE k

Node = tuple[str, int]


def command_key(command: Command) -> bytes | None:
    """The key a command works on (the one that picks its slot), or None for any node."""
    if isinstance(command, Packed):
        return command.key
    name = as_bytes(command[0]).upper() if command else b""
    at: int | None = 1 if len(command) > 1 and name not in _KEYLESS else None
    if name in _SCRIPTS:
        at = 3 if len(command) > 3 and int(command[2]) > 0 else None
    elif name in _KEY_AFTER_SUBCOMMAND:
        at = 2 if len(command) > 2 else None
    elif name in _STREAM_READS:
        words = [as_bytes(arg).upper() for arg in command]
        at = words.index(b"STREAMS") + 1 if b"STREAMS" in words[:-1] else None
    return None if at is None else as_bytes(command[at])


def slot_of(command: Command) -> int | None:
    key = command_key(command)
    return None if key is None else int(key_slot(key))


def parse_slots(reply: Any, asked: Node) -> list[Node | None]:
    """The owner of every slot from a ``CLUSTER SLOTS`` reply; ``asked`` stands in for a node
    that announces no address (an empty or unknown host means "the one you asked")."""
    table: list[Node | None] = [None] * SLOTS
    for row in reply or ():
        start, end, master = int(row[0]), int(row[1]), row[2]
        host = master[0].decode() if isinstance(master[0], bytes) else str(master[0] or "")
        node = (host if host and host != "?" else asked[0], int(master[1]))
        for slot in range(start, end + 1):
            table[slot] = node
    return table


def redirect(reply: Any) -> tuple[str, Node] | None:
    """("MOVED" | "ASK", node) of a redirection error reply, else None."""
    if not isinstance(reply, RedisCommandError):
        return None
    words = str(reply).split(" ")
    if len(words) != 3 or words[0] not in ("MOVED", "ASK"):
        return None
    host, _, port = words[2].rpartition(":")
    return words[0], (host, int(port))


class ClusterClient:
    """Commands over a Redis Cluster, with ``RespClient``'s interface; safe to share."""

    def __init__(self, seed: RedisAddress, *, timeout_s: float = 10.0,
                 connect_timeout_s: float = 10.0, name: str = "ferry") -> None:
        if seed.path is not None or seed.db:
            raise ConfigError("a Redis Cluster is reached over TCP and has only database 0")
        self.address = seed
        self._seed: Node = (seed.host, seed.port)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.name = name
        self._nodes: dict[Node, RespClient] = {}
        self._table: list[Node | None] | None = None
        self._refresh_lock = asyncio.Lock()
        self._refreshed_at = 0.0
        self._stale = False
        self._scripts: list[str] = []

    # -- the RespClient interface ---------------------------------------------------------------

    async def execute(self, *command: Arg, timeout_s: float | None = None) -> Any:
        single = command[0] if len(command) == 1 and isinstance(command[0], Packed) else command
        replies = await self.replies([single], timeout_s)
        raise_first(replies)
        return replies[0]

    async def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        replies = await self.replies(commands) if commands else []
        raise_first(replies)
        return replies

    def register_script(self, source: str) -> Script:
        self._scripts.append(source)
        for client in self._nodes.values():
            client.register_script(source)
        return Script(source)

    async def close(self) -> None:
        for client in self._nodes.values():
            await client.close()
        self._nodes.clear()

    # -- routing --------------------------------------------------------------------------------

    async def replies(self, commands: Sequence[Command], timeout_s: float | None = None
                      ) -> list[Any]:
        """Every command's reply in the caller's order (errors as values), each sent to the
        node that owns its key's slot."""
        results: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        for _ in range(MAX_REDIRECTS):
            todo = await self._round(commands, todo, results, timeout_s)
            if not todo:
                return results
            await self._refresh(force=True)
        for index in todo:
            results[index] = RedisUnavailableError(
                f"Redis Cluster redirected a command {MAX_REDIRECTS} times (slots moving?)")
        return results

    async def _round(self, commands: Sequence[Command], todo: list[int], results: list[Any],
                     timeout_s: float | None) -> list[int]:
        """Send the ``todo`` commands, each node's share at once; file their replies in
        ``results``; the commands that were MOVED (to send again with a fresh slot map)."""
        table = await self._slot_table()
        groups: dict[Node, list[int]] = {}
        for index in todo:
            groups.setdefault(self._owner(commands[index], table), []).append(index)
        moved: list[int] = []
        asked: list[tuple[int, Node]] = []
        answers = await asyncio.gather(
            *(self.node(node).replies([commands[i] for i in indexes], timeout_s)
              for node, indexes in groups.items()), return_exceptions=True)
        for (node, indexes), answer in zip(groups.items(), answers, strict=True):
            failed = answer
            if isinstance(answer, asyncio.CancelledError):  # a node's client closed under it
                failed = RespConnectionError(f"the connection to {node[0]}:{node[1]} closed "
                                             "(it left the slot map)")
            elif not isinstance(answer, list) and not isinstance(answer, Exception):
                raise answer
            got = answer if isinstance(answer, list) else [failed] * len(indexes)  # no node
            for index, reply in zip(indexes, got, strict=True):
                self._sort(index, reply, results, moved, asked)
        for index, node in asked:
            reply = (await self.node(node).replies([("ASKING",), commands[index]],
                                                   timeout_s))[1]
            self._sort(index, reply, results, moved, [])
        return moved

    def _sort(self, index: int, reply: Any, results: list[Any], moved: list[int],
              asked: list[tuple[int, Node]]) -> None:
        """File one reply: an answer, a command to send again after MOVED, or one to ASK."""
        found = redirect(reply)
        if found is None:
            if isinstance(reply, RespConnectionError):
                self._stale = True
            results[index] = reply
        elif found[0] == "MOVED":
            moved.append(index)
        else:
            asked.append((index, found[1]))

    def _owner(self, command: Command, table: list[Node | None]) -> Node:
        slot = slot_of(command)
        if slot is None:  # keyless: any node (one already connected, if there is one)
            return next(iter(self._nodes), self._seed)
        # a slot no master serves goes to the seed, which answers MOVED or CLUSTERDOWN
        return table[slot] or self._seed

    def node(self, node: Node) -> RespClient:
        """The connection to one node (opened on first use, with every script)."""
        client = self._nodes.get(node)
        if client is None:
            client = RespClient(replace(self.address, host=node[0], port=node[1]),
                                timeout_s=self.timeout_s,
                                connect_timeout_s=self.connect_timeout_s, name=self.name)
            for source in self._scripts:
                client.register_script(source)
            self._nodes[node] = client
        return client

    async def masters(self) -> list[RespClient]:
        """The connection to each master that serves slots now."""
        table = await self._slot_table()
        return [self.node(node) for node in dict.fromkeys(n for n in table if n is not None)]

    def slots_moved(self) -> None:
        """A command sent straight to a node was redirected: ask for the slot map again."""
        self._stale = True

    async def node_of(self, key: Arg) -> RespClient:
        """The connection to the node that owns ``key``'s slot now."""
        table = await self._slot_table()
        return self.node(table[int(key_slot(as_bytes(key)))] or self._seed)

    # -- the slot map ---------------------------------------------------------------------------

    async def _slot_table(self) -> list[Node | None]:
        if self._table is None:
            await self._refresh(force=True)
        elif self._stale and time.monotonic() - self._refreshed_at >= REFRESH_HOLD_S:
            with contextlib.suppress(RespConnectionError):  # keep the map we have: the
                await self._refresh(force=False)  # commands will say what is wrong
        assert self._table is not None
        return self._table

    async def _refresh(self, *, force: bool) -> None:
        """Ask the seed, then every known node, which master serves each slot."""
        seen = self._refreshed_at
        async with self._refresh_lock:
            if self._refreshed_at != seen and not (force and self._table is None):
                return  # another caller refreshed it while this one waited
            candidates = [self._seed, *(n for n in self._nodes if n != self._seed)]
            problem: Exception | None = None
            for candidate in candidates:
                try:
                    reply = await self.node(candidate).execute("CLUSTER", "SLOTS")
                except RespConnectionError as exc:
                    problem = exc
                    continue
                except RedisCommandError as exc:
                    if "cluster support disabled" in str(exc):
                        raise ConfigError(
                            f"Redis at {self.address} is not a cluster: set "
                            "FERRY_REDIS_CLUSTER=false (redis_cluster) for a single Redis"
                        ) from exc
                    raise
                self._table = parse_slots(reply, candidate)
                self._stale = False
                self._refreshed_at = time.monotonic()
                serving = set(self._table)
                for gone in [n for n in self._nodes if n not in serving]:
                    await self._nodes.pop(gone).close()
                return
            self._refreshed_at = time.monotonic()
            raise RespConnectionError(f"no node of the Redis Cluster answered: {problem}")
