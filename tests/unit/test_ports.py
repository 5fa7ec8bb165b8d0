"""Free loopback ports: one process never hands the same port out twice, nor a claimed one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ferry.stack import ports


class ScriptedSocket:
    """A socket whose bind to port 0 lands on the next port of a script (the kernel's choice)."""

    script: Iterator[int] = iter(())

    def __init__(self, *_args: object) -> None:
        self.port = 0

    def __enter__(self) -> ScriptedSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def bind(self, _address: tuple[str, int]) -> None:
        self.port = next(ScriptedSocket.script)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedSocket]:
    monkeypatch.setattr(ports, "_CLAIMED", set())
    monkeypatch.setattr("socket.socket", ScriptedSocket)
    return ScriptedSocket


def test_a_port_the_kernel_offers_again_is_not_handed_out_twice(
        kernel: type[ScriptedSocket]) -> None:
    kernel.script = iter([5000, 5000, 5000, 5001])
    assert ports.free_port() == 5000
    assert ports.free_port() == 5001


def test_a_claimed_port_is_never_handed_out(kernel: type[ScriptedSocket]) -> None:
    kernel.script = iter([6000, 6001, 6000, 6002])
    ports.claim(6000, 0)  # 0: an option left unset, nothing to claim
    assert ports.free_ports(2) == [6001, 6002]


def test_no_free_port_is_an_error_not_a_loop(kernel: type[ScriptedSocket]) -> None:
    kernel.script = iter([7000] * 1000)
    ports.claim(7000)
    with pytest.raises(OSError, match="no 1 free ports"):
        ports.free_port()


def test_real_draws_are_distinct() -> None:
    """200 real draws: the kernel alone repeated a port in 34 of 50 such runs here."""
    drawn = [ports.free_port() for _ in range(200)]
    assert len(set(drawn)) == len(drawn)
