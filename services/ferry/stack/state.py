"""Where ``ferry up`` keeps its state (``FERRY_STATE_DIR``, ``.ferry`` by default), as the
client commands find it: ``ferry rollout`` and ``ferry usage`` read its admin token there,
``ferry log tail`` its Redis's URL and settings, ``ferry plan fit`` its Triton's own gRPC address.

A relative state directory is looked for in the current directory and then in each one above
it, as git finds ``.git``: the commands work from anywhere under the directory ``ferry up`` (or
``make up``) ran in. The search ends at a repository's root (a directory holding ``.git``) or
at the home directory, and takes only a state directory of this user's own: another's
``/tmp/.ferry`` is never read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT = ".ferry"
ADMIN_TOKEN_FILE = "admin-token"  # noqa: S105  # the file's name, not a token
REDIS_URL_FILE = "redis-url"  # its Redis's URL, for ``ferry log tail`` on this machine
REDIS_ENV_FILE = "redis.env"  # the rest of its Redis settings (FERRY_REDIS_*=value lines)
# Kept beside the URL where set: how to reach the Redis, no password (those stay where they
# were given: the URL's own is in ``redis-url``).
REDIS_KEPT = ("redis_cluster", "redis_sentinels", "redis_sentinel_master", "redis_username",
              "redis_ca_file", "redis_cert_file", "redis_key_file")
TRITON_URL_FILE = "triton-url"  # its Triton's gRPC host:port, for ``ferry plan fit``


def state_dir(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The state directory: ``FERRY_STATE_DIR`` (an absolute one as it is), else the nearest
    ``.ferry`` (or the relative ``FERRY_STATE_DIR``) in the current directory or above it; the
    current directory's when there is none."""
    named = Path((os.environ if environ is None else environ).get("FERRY_STATE_DIR") or DEFAULT)
    if named.is_absolute():
        return named
    here = (cwd or Path.cwd()).resolve()
    home = Path.home().resolve()
    for folder in (here, *here.parents):
        if (folder / named).is_dir() and _mine(folder / named):
            return folder / named
        if folder == home or (folder / ".git").exists():
            break
    return here / named


def _mine(path: Path) -> bool:
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False


def kept(name: str, environ: Mapping[str, str] | None = None, cwd: Path | None = None
         ) -> tuple[str, Path]:
    """A file of the state directory, stripped ('' when there is none), and where it was
    looked for."""
    path = state_dir(environ, cwd) / name
    return (path.read_text().strip() if path.is_file() else ""), path


def redis_env(saved: Path) -> dict[str, str]:
    """``ferry up``'s Redis settings kept in the state directory ``saved`` as ``FERRY_*``
    variables: its URL and, where set, how to reach it (``REDIS_KEPT``); empty when it kept
    none."""
    env: dict[str, str] = {}
    url = saved / REDIS_URL_FILE
    if url.is_file():
        env["FERRY_REDIS_URL"] = url.read_text().strip()
    rest = saved / REDIS_ENV_FILE
    if rest.is_file():
        for line in rest.read_text().splitlines():
            name, found, value = line.partition("=")
            if found and name.startswith("FERRY_REDIS_"):
                env[name] = value
    return env
