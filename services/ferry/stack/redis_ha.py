"""Highly-available Redis on loopback, for tests and the soak: a master with replicas watched by
Sentinels, and a Redis Cluster whose masters have a replica each. Real ``redis-server`` and
``redis-sentinel`` processes, with timeouts short enough that a failover takes seconds."""

from __future__ import annotations

import functools
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ferry.errors import StartupError
from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.process import ManagedProcess
from ferry.stack.redis_server import answers_ping, create_cluster, redis_argv


def _ask(port: int, *command: str, timeout_s: float = 1.0) -> bytes:
    """One inline command's raw reply (b"" if the server does not answer)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
            sock.sendall(" ".join(command).encode() + b"\r\n")
            return sock.recv(65536)
    except OSError:
        return b""


def _poll(check: Callable[[], bool], timeout_s: float, failure: str) -> None:
    """Until ``check`` passes (every 0.1 s), or StartupError(``failure``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise StartupError(failure)


@dataclass
class RedisNode:
    """One redis-server that can be killed and started again on its port, with its data."""

    port: int
    data_dir: Path
    extra: list[str] = field(default_factory=list)
    process: ManagedProcess | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            f"redis-{self.port}", [*redis_argv(self.port, self.data_dir, persist=False),
                                   "--repl-diskless-sync-delay", "0", *self.extra],
            log_path=self.data_dir / "redis.log")
        self.process.start()
        self.process.wait_ready(functools.partial(answers_ping, self.port), timeout_s)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """``kill -9`` by default: no shutdown, no last write."""
        if self.process is not None:
            self.process.stop(grace_s=5, sig=sig)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def in_sync(self) -> bool:
        """Whether it is a replica whose link to its master is up."""
        return b"master_link_status:up" in _ask(self.port, "INFO", "replication")

    def role(self) -> bytes:
        """``master`` or ``slave`` (b"" when it does not answer)."""
        reply = _ask(self.port, "ROLE")
        return reply.split(b"\r\n")[2] if reply.startswith(b"*") else b""


def _sentinel_binary() -> str:
    binary = shutil.which("redis-sentinel")
    if binary is None:
        raise StartupError("redis-sentinel not found on PATH (Debian: apt-get install "
                           "redis-sentinel)")
    return binary


@dataclass
class SentinelGroup:
    """A master, its replicas and the sentinels that watch them (quorum: a majority)."""

    name: str
    nodes: list[RedisNode]  # the first started as the master
    sentinels: list[ManagedProcess]
    sentinel_ports: list[int]

    @property
    def sentinel_spec(self) -> str:
        """``FERRY_REDIS_SENTINELS``'s value."""
        return ",".join(f"{LOOPBACK}:{p}" for p in self.sentinel_ports)

    def master_port(self) -> int | None:
        """The master's port by the first sentinel that answers."""
        for port in self.sentinel_ports:
            reply = _ask(port, "SENTINEL", "get-master-addr-by-name", self.name)
            lines = reply.split(b"\r\n")
            if reply.startswith(b"*2") and len(lines) >= 5:
                return int(lines[4])
        return None

    def master(self) -> RedisNode:
        port = self.master_port()
        return next(n for n in self.nodes if n.port == port)

    def wait_failover(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Until the sentinels name another master that answers as one; its port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.master_port()
            if port is not None and port != old_port:
                node = next(n for n in self.nodes if n.port == port)
                if node.role() == b"master":
                    return port
            time.sleep(0.1)
        raise StartupError(f"the sentinels did not fail {self.name} over in {timeout_s:g} s")

    def restart(self, node: RedisNode, timeout_s: float = 30.0) -> None:
        """Start a killed node again as a replica of the master the sentinels name (never as
        an empty master: its replicas would copy its emptiness)."""
        port = self.master_port()
        node.extra = ["--replicaof", LOOPBACK, str(port)] if port and port != node.port else []
        node.start(timeout_s)

    def wait_replica(self, node: RedisNode, timeout_s: float = 30.0) -> None:
        """Until ``node`` is a replica in sync with the master."""
        _poll(node.in_sync, timeout_s, f"redis on {node.port} did not catch up as a replica")

    def stop(self) -> None:
        """Everything at once (a master given SIGTERM waits up to 10 s for its replicas)."""
        for sentinel in self.sentinels:
            sentinel.stop(grace_s=5)
        for node in self.nodes:
            node.kill()


def start_sentinel_group(data_dir: Path, *, replicas: int = 2, sentinels: int = 3,
                         name: str = "ferry", down_after_ms: int = 2500,
                         timeout_s: float = 60.0) -> SentinelGroup:
    """A master with ``replicas`` replicas and ``sentinels`` sentinels, all on loopback; returns
    once every replica is in sync and every sentinel sees them all."""
    nodes = [RedisNode(free_port(), data_dir / f"redis{i}") for i in range(replicas + 1)]
    group = SentinelGroup(name, nodes, [], [])
    try:
        nodes[0].start(timeout_s)
        for node in nodes[1:]:
            node.extra = ["--replicaof", LOOPBACK, str(nodes[0].port)]
            node.start(timeout_s)
        for index in range(sentinels):
            _start_sentinel(group, data_dir / f"sentinel{index}", nodes[0].port,
                            quorum=sentinels // 2 + 1, down_after_ms=down_after_ms)
        _wait_watched(group, replicas, timeout_s)
    except BaseException:
        group.stop()
        raise
    for node in nodes[1:]:
        node.extra = []  # started again, a node waits for the sentinels to make it a replica
    return group


def _start_sentinel(group: SentinelGroup, directory: Path, master_port: int, *, quorum: int,
                    down_after_ms: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "sentinel.conf"
    config.write_text("\n".join([
        f"port {port}", f"bind {LOOPBACK}", f"dir {directory}", "protected-mode yes",
        f"sentinel monitor {group.name} {LOOPBACK} {master_port} {quorum}",
        f"sentinel down-after-milliseconds {group.name} {down_after_ms}",
        f"sentinel failover-timeout {group.name} {max(10 * down_after_ms, 10000)}",
        f"sentinel parallel-syncs {group.name} 1", ""]))
    process = ManagedProcess(f"sentinel-{port}", [_sentinel_binary(), str(config)],
                             log_path=directory / "sentinel.log")
    process.start()
    group.sentinels.append(process)
    group.sentinel_ports.append(port)
    process.wait_ready(functools.partial(answers_ping, port), 30.0)


def _wait_watched(group: SentinelGroup, replicas: int, timeout_s: float) -> None:
    """Until every replica is in sync with the master and every sentinel knows the others."""
    deadline = time.monotonic() + timeout_s
    master = group.nodes[0].port
    others = len(group.sentinel_ports) - 1
    while time.monotonic() < deadline:
        synced = _ask(master, "INFO", "replication").count(b"state=online")
        known = [_ask(p, "SENTINEL", "master", group.name) for p in group.sentinel_ports]
        if synced >= replicas and all(_field(k, b"num-other-sentinels") >= others and
                                      _field(k, b"num-slaves") >= replicas for k in known):
            return
        time.sleep(0.2)
    raise StartupError("the sentinel group did not come together in time")


def _field(reply: bytes, name: bytes) -> int:
    """A number from a ``SENTINEL MASTER`` reply (a flat list of names and values)."""
    lines = reply.split(b"\r\n")
    for index, line in enumerate(lines):
        if line == name and index + 2 < len(lines):
            value = lines[index + 2]
            return int(value) if value.isdigit() else -1
    return -1


@dataclass
class ReplicatedCluster:
    """A Redis Cluster whose every master has a replica."""

    nodes: list[RedisNode]

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.nodes[0].port}/0"

    def master_of_slot(self, slot: int) -> RedisNode:
        for node in self.nodes:
            if not node.running:
                continue
            for row in _cluster_slots(node.port):
                if row[0] <= slot <= row[1]:
                    return next(n for n in self.nodes if n.port == row[2])
        raise StartupError(f"no running node knows who serves slot {slot}")

    def wait_serving(self, slot: int, not_port: int, timeout_s: float = 30.0) -> RedisNode:
        """Until another node than ``not_port`` serves ``slot`` and the cluster is ok."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                node = self.master_of_slot(slot)
            except StartupError:
                node = None
            if node is not None and node.port != not_port and b"cluster_state:ok" in _ask(
                    node.port, "CLUSTER", "INFO"):
                return node
            time.sleep(0.1)
        raise StartupError(f"slot {slot} was not failed over in {timeout_s:g} s")

    def rejoin(self, node: RedisNode, timeout_s: float = 30.0) -> None:
        """Start a killed node again (its nodes.conf kept): the cluster makes it a replica of
        the node that took its slots; returns once it is in sync."""
        node.start(timeout_s)
        _poll(node.in_sync, timeout_s, f"redis on {node.port} did not rejoin as a replica")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


def _wait_synced(nodes: list[RedisNode], replicas: int, timeout_s: float) -> None:
    """Until ``replicas`` nodes are replicas in sync with their master (only those can take
    over from it)."""
    _poll(lambda: sum(n.in_sync() for n in nodes) >= replicas, timeout_s,
          "the replicas did not catch up with their masters in time")


def _cluster_slots(port: int) -> list[tuple[int, int, int]]:
    """(first slot, last slot, master port) rows, read with redis-cli (a nested reply)."""
    cli = shutil.which("redis-cli") or "redis-cli"
    out = subprocess.run(  # noqa: S603 - argv is built here, never a shell
        [cli, "-h", LOOPBACK, "-p", str(port), "cluster", "slots"],
        capture_output=True, text=True, timeout=5, check=False).stdout.split()
    rows: list[tuple[int, int, int]] = []
    index = 0
    while index + 3 < len(out):  # each row: first, last, master host, master port, its id, ...
        if out[index].isdigit() and out[index + 1].isdigit() and out[index + 2] == LOOPBACK:
            rows.append((int(out[index]), int(out[index + 1]), int(out[index + 3])))
            index += 4
        else:
            index += 1
    return rows


def start_replicated_cluster(data_dir: Path, *, masters: int = 3, node_timeout_ms: int = 1000,
                             timeout_s: float = 60.0) -> ReplicatedCluster:
    """``masters`` masters with a replica each (``redis-cli --cluster create
    --cluster-replicas 1``), a replica promoted ``node_timeout_ms`` after its master fails."""
    nodes: list[RedisNode] = []
    try:
        for index in range(2 * masters):
            directory = data_dir / f"node{index}"
            node = RedisNode(free_port(), directory, [
                "--cluster-enabled", "yes", "--cluster-config-file", str(directory / "nodes.conf"),
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-port", str(free_port())])
            nodes.append(node)
            node.start(timeout_s)
        create_cluster([n.port for n in nodes], timeout_s, replicas=1)
        _wait_synced(nodes, masters, timeout_s)
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return ReplicatedCluster(nodes)
