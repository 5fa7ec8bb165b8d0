"""A child process that dies with its parent and stops in two phases (signal, then kill)."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from ferry.errors import StartupError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends SIGTERM if the parent goes away."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


SETPRIV = shutil.which("setpriv")  # util-linux: sets the same without Python in the child


def _launch(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The argv to run and the code to run in the child before exec, for a child that gets
    SIGTERM when its parent dies. With ``setpriv`` no Python runs between fork and exec, which
    a parent with threads (gRPC's, for one) needs: a forked copy of them can crash the child."""
    if SETPRIV is not None:
        return [SETPRIV, "--pdeathsig", "TERM", "--", *argv], None
    return list(argv), _die_with_parent


class ManagedProcess:
    """One child process with a readiness check and a bounded, two-phase stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
        new_session: bool = True,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.log_path = log_path
        self.cwd = cwd
        self.new_session = new_session  # own process group: a terminal's Ctrl-C reaches only us
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._group_ended = False  # what outlived the process was killed (once per start)

    def start(self) -> None:
        """Start the process; its output goes to ``log_path`` (or is inherited)."""
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        argv, before_exec = _launch(self.argv)
        self._group_ended = False
        self._proc = subprocess.Popen(  # noqa: S603 - argv is built by Ferry, never a shell
            argv,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
            preexec_fn=before_exec,  # noqa: PLW1509 - without setpriv only: ctypes.prctl
            start_new_session=self.new_session,
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def wait_ready(self, check: Callable[[], bool], timeout_s: float,
                   interrupted: Callable[[], bool] = lambda: False) -> None:
        """Poll ``check`` until it passes; fail fast if the process exits or we are interrupted."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if interrupted():
                raise StartupError(f"interrupted while {self.name} was starting")
            if not self.running():
                code = self.returncode()
                raise StartupError(f"{self.name} exited with code {code}{self._tail()}")
            if check():
                return
            time.sleep(0.1)
        raise StartupError(f"{self.name} not ready after {timeout_s:.0f}s{self._tail()}")

    def stop(self, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """Signal the process, wait up to ``grace_s``, then kill it; then kill whatever of its
        session outlived it (tritonserver's backend stubs, when it was killed or crashed: their
        parent gone, they would run on). Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc is not None and self.new_session and not self._group_ended:
            self._group_ended = True  # once: its number may be another group's later
            kill_group(proc.pid)
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode if proc else None

    def _tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"; last lines of {self.log_path}:\n" + "\n".join(text)


def kill_group(leader: int, sig: int = signal.SIGKILL) -> bool:
    """Signal what is left of the group a process started in a session of its own led (its
    children joined it), once that process has ended and been reaped; False if none is left.

    While any process of the group lives, the kernel gives its number to no new process. So
    with no process of the leader's pid alive, the group of that number is the leader's own;
    with one alive, the number has gone to a new process, and nothing is signalled."""
    if Path(f"/proc/{leader}").exists():
        return False
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def env_with(extra: Mapping[str, str]) -> dict[str, str]:
    """The current environment with ``extra`` on top."""
    env = dict(os.environ)  # a child process inherits this one's environment (PATH, FERRY_*...)
    env.update(extra)
    return env
