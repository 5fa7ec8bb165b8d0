"""ferry.stack.process: a stopped process takes what it started with it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ferry.stack.process import ManagedProcess, kill_group


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:  # reaped
        return False


def _started_child(tmp_path: Path, name: str) -> tuple[ManagedProcess, int]:
    """A shell that leaves a child behind (as tritonserver leaves its backend stubs) and waits."""
    child_pid = tmp_path / f"{name}.pid"
    proc = ManagedProcess(name, ["sh", "-c", f"sleep 60 & echo $! > {child_pid}; wait"])
    proc.start()
    deadline = time.monotonic() + 10
    while not (child_pid.exists() and child_pid.read_text().strip()):
        assert time.monotonic() < deadline, "the shell never started its child"
        time.sleep(0.02)
    return proc, int(child_pid.read_text())


def test_stopping_a_process_ends_the_children_it_left_behind(tmp_path: Path) -> None:
    proc, child = _started_child(tmp_path, "stopped")
    assert _alive(child)
    proc.stop(grace_s=5)  # the shell ends on SIGTERM; its sleep would not
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)


def test_a_process_that_died_alone_is_stopped_with_its_orphans(tmp_path: Path) -> None:
    proc, child = _started_child(tmp_path, "killed")
    assert proc.pid is not None
    os.kill(proc.pid, 9)  # as a fault kills it: its child lives on, without its parent
    deadline = time.monotonic() + 5
    while proc.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _alive(child)
    proc.stop(grace_s=1)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)


def test_a_group_is_signalled_only_once_its_leader_is_gone_and_once_per_start(
        tmp_path: Path) -> None:
    assert kill_group(os.getpid()) is False  # a live process's number: never signalled
    proc, child = _started_child(tmp_path, "twice")
    proc.stop(grace_s=5)
    assert proc._group_ended
    proc.stop(grace_s=5)  # again: nothing is signalled (the number may be another's by now)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)
    proc.start()  # started again: its new group is ended when it stops
    assert not proc._group_ended
    proc.stop(grace_s=5)
    assert proc._group_ended
