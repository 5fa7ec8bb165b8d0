"""Free loopback ports."""

import contextlib
import socket
import urllib.error
import urllib.request

LOOPBACK = "127.0.0.1"
_TRIES = 64

# Ports this process has handed out or been told are taken. A port found free is free only
# until someone binds it: `ferry up` picks Redis's, Triton's three and the batcher's metrics
# port one after another before any of them binds, and the kernel may offer a port again once
# its probe socket closes (once, the batcher's metrics server got the gateway's --port).
_CLAIMED: set[int] = set()


def claim(*ports: int) -> None:
    """Never hand out ``ports`` (ones given on a command line, say) from this process."""
    _CLAIMED.update(port for port in ports if port)


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nothing listens on right now and that this process
    has not handed out or claimed before."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports on ``host`` that nothing listens on right now and that this
    process has not handed out or claimed before."""
    with contextlib.ExitStack() as stack:
        found: list[int] = []
        for _ in range(_TRIES * count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if port not in _CLAIMED:
                found.append(port)
                _CLAIMED.add(port)
            if len(found) == count:
                return found
    raise OSError(f"no {count} free ports on {host} in {_TRIES * count} tries")


def is_listening(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a GET of ``url`` (a loopback address) answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False
