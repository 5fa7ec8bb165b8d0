"""The chart's Redis with replicas and sentinels, run as its pods run it but on loopback: the
script of the rendered ConfigMap starts real ``redis-server`` nodes and sentinels with the
environment the chart gives their containers (pod names replaced by loopback ports), and the
group forms, confirms writes on replicas, fails over when its master is killed, takes the old
master back as a replica, and hands over when a master is stopped (the preStop hook)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from ferry.stack.ports import LOOPBACK, free_ports
from ferry.stack.process import ManagedProcess
from tests.deploy.test_chart import by_kind, render

PASSWORD = 'a "quoted" pass\\word'  # what a configuration file must quote and escape
MASTER = "mymaster"
# Short, as on loopback; not shorter: a master slowed down by a busy machine must not seem down.
SETTINGS = ("--set", "redis.sentinel.enabled=true", "--set", "redis.sentinel.downAfterMs=2000",
            "--set", "redis.sentinel.failoverTimeoutMs=4000")


@dataclass
class Group:
    """Three nodes and three sentinels, each a process started by the chart's script."""

    script: Path
    directory: Path
    node_env: dict[str, str]
    sentinel_env: dict[str, str]
    node_ports: list[int]
    sentinel_ports: list[int]
    processes: dict[int, ManagedProcess] = field(default_factory=dict)

    def env(self, port: int) -> dict[str, str]:
        base = self.node_env if port in self.node_ports else self.sentinel_env
        return {**base, "SELF": f"{LOOPBACK}:{port}", "DATA_DIR": str(self.directory / str(port)),
                "CONF_DIR": str(self.directory / str(port))}

    def start(self, port: int) -> None:
        role = "node" if port in self.node_ports else "sentinel"
        (self.directory / str(port)).mkdir(exist_ok=True)
        process = ManagedProcess(f"{role}-{port}", ["sh", str(self.script), role],
                                 env=self.env(port), log_path=self.directory / f"{port}.log")
        process.start()
        self.processes[port] = process

    def script_says(self, port: int, command: str) -> bool:
        """Whether ``redis-sentinel.sh command`` (a probe, the preStop hook) succeeds."""
        done = subprocess.run(["sh", str(self.script), command], env=self.env(port),
                              capture_output=True, timeout=30, check=False)
        return done.returncode == 0

    def ask(self, port: int, *command: str | int) -> Any:
        """One command's reply, unparsed (bytes)."""
        client = redis.Redis(LOOPBACK, port, password=PASSWORD, socket_timeout=3)
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def master(self, via: int | None = None) -> int:
        """The master's port, as a sentinel (the first) says."""
        host, port = self.ask(via or self.sentinel_ports[0], "SENTINEL",
                              "get-master-addr-by-name", MASTER)
        assert host == LOOPBACK.encode()
        return int(port)

    def sentinel_view(self) -> dict[str, str]:
        """What the first sentinel knows of the master (SENTINEL MASTER)."""
        reply = self.ask(self.sentinel_ports[0], "SENTINEL", "MASTER", MASTER)
        pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2],
                                                                   strict=True)
        return {_text(k): _text(v) for k, v in pairs}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _container_env(manifest: str, name: str) -> dict[str, str]:
    pod = by_kind(manifest)[("StatefulSet", name)]["spec"]["template"]["spec"]
    return {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}


def _eventually(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = check()
        except redis.RedisError:
            result = None
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:g} s: {what}")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    for binary in ("redis-server", "redis-cli", "timeout"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is not on PATH (Debian: apt-get install redis-server "
                        "redis-tools)")
    manifest = render("values.yaml", *SETTINGS)
    script = tmp_path / "redis-sentinel.sh"
    config_map = by_kind(manifest)[("ConfigMap", "ferry-redis-scripts")]
    script.write_text(config_map["data"]["redis-sentinel.sh"] + "\n")
    (tmp_path / "password").write_text(PASSWORD + "\n")
    ports = free_ports(6)
    nodes, sentinels = ports[:3], ports[3:]
    names = {"NODES": ",".join(f"{LOOPBACK}:{p}" for p in nodes),
             "SENTINELS": ",".join(f"{LOOPBACK}:{p}" for p in sentinels),
             "PASSWORD_FILE": str(tmp_path / "password"), "PATH": os.environ["PATH"]}
    built = Group(script, tmp_path,
                  {**_container_env(manifest, "ferry-redis"), **names},
                  {**_container_env(manifest, "ferry-redis-sentinel"), **names}, nodes, sentinels)
    try:
        for port in ports:
            built.start(port)
        yield built
    finally:
        for process in built.processes.values():
            process.stop(grace_s=5)
        for log in sorted(tmp_path.glob("*.log")):  # shown when the test failed
            print(f"--- {log.name}", *log.read_text().splitlines()[-12:], sep="\n")


def _formed(group: Group) -> dict[str, str]:
    """Once every sentinel and node is ready (their probes say so) and the sentinels see it all:
    what the first sentinel knows of the master."""
    for port in group.sentinel_ports:
        _eventually(partial(group.script_says, port, "sentinel-ready"), f"sentinel {port}")
    for port in group.node_ports:
        _eventually(partial(group.script_says, port, "node-ready"), f"node {port}")

    def whole() -> dict[str, str] | None:
        view = group.sentinel_view()
        return view if view["num-slaves"] == view["num-other-sentinels"] == "2" else None

    found: dict[str, str] = _eventually(whole, "the sentinels see the group")
    return found


def test_the_group_forms_confirms_writes_and_a_stopping_master_hands_over(group: Group) -> None:
    assert group.sentinel_env["QUORUM"] == "2" and group.sentinel_env["DOWN_AFTER_MS"] == "2000"
    view = _formed(group)
    first = group.node_ports[0]
    assert group.master() == first  # a new group: the first node leads
    assert view["quorum"] == "2" and view["down-after-milliseconds"] == "2000"
    group.ask(first, "SET", "admitted", "1")
    assert group.ask(first, "WAIT", 2, 2000) == 2  # FERRY_REDIS_MIN_REPLICAS
    started = time.monotonic()
    assert group.script_says(first, "node-handover")  # the preStop hook
    assert time.monotonic() - started < 10  # its budget is 20 s; a sentinel promotes in ~1 s
    promoted = group.master()
    assert promoted != first and group.ask(promoted, "GET", "admitted") == b"1"
    assert group.ask(first, "ROLE")[:3] == [b"slave", LOOPBACK.encode(), promoted]
    with pytest.raises(redis.ReadOnlyError):  # a client still on the old master is told so
        group.ask(first, "SET", "late", "1")
    assert group.script_says(first, "node-handover")  # now a replica: nothing to hand over
    assert group.master() == promoted


def _settled(group: Group) -> int | None:
    """The master's port once every other node follows it and all are ready, else None."""
    master = group.master(via=group.sentinel_ports[-1])
    followers = [p for p in group.node_ports if p != master]
    if all(group.ask(p, "ROLE")[:3] == [b"slave", LOOPBACK.encode(), master]
           for p in followers) and all(group.script_says(p, "node-ready")
                                       for p in group.node_ports):
        return master
    return None


def test_a_killed_master_is_replaced_and_comes_back_as_a_replica(group: Group) -> None:
    first = group.node_ports[0]
    _formed(group)
    group.ask(first, "SET", "admitted", "1")
    assert group.ask(first, "WAIT", 2, 2000) == 2
    group.processes[first].stop(grace_s=0, sig=9)

    def another_master() -> int | None:
        master = group.master()
        return master if master != first else None

    promoted: int = _eventually(another_master, "a failover")
    assert group.ask(promoted, "GET", "admitted") == b"1"
    group.start(first)  # the pod restarted: its script asks the sentinels who leads now
    master: int = _eventually(partial(_settled, group), "the group settled")
    assert group.ask(master, "GET", "admitted") == b"1"
    started = (group.directory / f"{first}.log").read_text().rsplit("redis node ", 1)[1]
    assert started.startswith(f"{LOOPBACK}:{first}: the master is {LOOPBACK}:{promoted}\n")
    # A sentinel restarted watches the master the others know (not the first node).
    sentinel = group.sentinel_ports[0]
    group.processes[sentinel].stop(grace_s=5)
    known = group.master(via=group.sentinel_ports[1])
    group.start(sentinel)
    _eventually(partial(group.script_says, sentinel, "sentinel-ready"), "the sentinel back")
    config = (group.directory / str(sentinel) / "sentinel.conf").read_text()
    assert f"sentinel monitor {MASTER} {LOOPBACK} {known} 2" in config
