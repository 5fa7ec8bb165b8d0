"""The ``ferry`` command as a terminal sees it: ``--help`` loads only what it prints, Ctrl-C
ends a sizing mid-search with exit code 130, one line on stderr and no traceback, and the client
commands take ``--json`` in one place (after the action) and a window such as ``--since -3h``."""

from __future__ import annotations

import argparse
import ast
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from ferry.cli import build_parser

# What a light command must not load: the planner's simulation and Triton's client (numpy),
# the services, their settings and the HTTP client.
HEAVY = ("ferry.planner.simulate", "ferry.settings", "ferry.gateway", "ferry.batcher",
         "ferry.stack", "httpx", "uvloop", "tritonclient", "numpy")


def loaded_after(argv: list[str]) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after ``ferry <argv>``."""
    probe = ("import sys\nfrom ferry.cli import main\ntry:\n"
             f"    main({argv!r})\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))")
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                          text=True, timeout=60)
    return list(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


def test_help_loads_neither_the_planner_nor_the_services() -> None:
    assert loaded_after(["--help"]) == []
    assert loaded_after(["--version"]) == []
    # ``keys new`` checks the client id by the settings' rule (``ferry.settings.auth``): the
    # settings import no feature (test_architecture), so they load no service with them.
    assert [m for m in loaded_after(["keys", "new", "--client", "ci"])
            if not m.startswith("ferry.settings")] == []


def test_the_planners_help_loads_no_triton_client() -> None:
    loaded = loaded_after(["plan", "size", "--help"])
    assert "ferry.planner.simulate" in loaded
    assert not [m for m in loaded if m.startswith(("tritonclient", "numpy", "httpx"))]


def read_until(fd: int, text: bytes, timeout_s: float) -> bytes:
    """What the terminal ``fd`` shows until ``text`` appears (or its writer closes it)."""
    seen, deadline = b"", time.monotonic() + timeout_s
    while text not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], deadline - time.monotonic())[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child has gone: the terminal is closed
                break
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.timeout(90)
def test_ctrl_c_ends_a_sizing_mid_search_with_130_and_one_line() -> None:
    """The design scenario, its progress on a terminal: Ctrl-C once the search has found a
    first answer (runs are still to come), as a terminal sends it."""
    terminal, child_side = pty.openpty()
    with subprocess.Popen(
            [sys.executable, "-m", "ferry", "plan", "size", "--qps", "10000", "--p99-ms", "500",
             "--t-fixed-ms", "40", "--t-per-ms", "2.5"],
            stdout=subprocess.PIPE, stderr=child_side,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    ) as proc:
        os.close(child_side)
        try:
            shown = read_until(terminal, b"best so far", 60)
            assert b"\r\x1b[Ksearching: " in shown and b"best so far" in shown, shown
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
            shown += read_until(terminal, b"\n", 5)
            assert proc.stdout is not None and proc.stdout.read() == b""
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(terminal)
    after = shown.rsplit(b"best so far", 1)[1]
    assert after.endswith(b"\r\x1b[Kferry plan size: interrupted\r\n"), shown
    assert b"Traceback" not in shown


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


@pytest.mark.parametrize("argv", [
    ("rollout", "status", "m", "--json"), ("rollout", "--json", "status", "m"),
    ("rollout", "set", "m", "--shadow", "5", "--json"), ("rollout", "decisions", "m", "--json"),
    ("usage", "--json"), ("usage", "--since", "1h", "--json"), ("jobs", "list", "--json"),
    ("jobs", "status", "j1", "--json"), ("plan", "size", "--qps", "10", "--p99-ms", "500",
                                          "--t-fixed-ms", "4", "--t-per-ms", "1", "--json"),
])
def test_json_goes_after_the_command_and_its_action(argv: tuple[str, ...]) -> None:
    assert parsed(*argv).json is True


def test_the_rollout_commands_options_go_before_or_after_its_action() -> None:
    before = parsed("rollout", "--url", "http://gw:1", "--token", "t", "status", "m")
    after = parsed("rollout", "status", "m", "--url", "http://gw:1", "--token", "t")
    assert (before.url, before.token, before.json) == (after.url, after.token, False) == (
        "http://gw:1", "t", False)


@pytest.mark.parametrize("argv", [("--since", "-3h"), ("--since=-3h",), ("--since", "3h"),
                                  ("--since=3h",)])
def test_usage_since_takes_a_window_with_or_without_its_minus(argv: tuple[str, ...]) -> None:
    assert parsed("usage", *argv).since == "3h"  # as the route takes it


@pytest.mark.parametrize("since", ["-3x", "3", "h", "--3h"])
def test_usage_since_that_is_no_window_is_refused_naming_why(
    since: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        parsed("usage", f"--since={since}")
    assert info.value.code == 2
    assert "argument --since: " in capsys.readouterr().err


def test_a_gateway_whose_port_is_in_use_says_so_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A start that cannot be made (here: the gRPC port is another process's) is one line on
    stderr and exit 1, as ``ferry up`` says it, not a traceback."""
    import socket

    from ferry.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["gateway", "--host", "127.0.0.1", "--port", "0",
                     "--grpc-port", str(port)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines() == [
        f"ferry gateway: port {port} on 127.0.0.1 is in use; pick another with --grpc-port "
        "(0: no gRPC)"]
