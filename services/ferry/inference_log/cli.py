"""``ferry log tail MODEL [-n N]``: a model's latest records in the inference log, oldest first,
one JSON object a line (the last ``keys.LOG_RECENT`` handed off are kept, whether a logger has
written them out yet or not). It reads Redis as the services do (``FERRY_REDIS_*``, or
``--redis-url``); beside ``ferry up``, the Redis that ``ferry up`` started (its URL is in
``.ferry/redis-url``, here or in a directory above). A count of records dropped at the stream's
bound goes to stderr."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ferry import keys
from ferry.errors import ConfigError, RedisError
from ferry.redis_conn import lean
from ferry.settings import CommonSettings, load
from ferry.stack.state import redis_env, state_dir


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("log", help="the inference log: a model's latest records")
    actions = parser.add_subparsers(dest="action", required=True)
    tail = actions.add_parser("tail", help="print a model's latest records, oldest first, as "
                              "JSON lines")
    tail.add_argument("model", help="a model named in FERRY_LOG_MODELS")
    tail.add_argument("-n", type=count, default=10, help="how many (default 10, at most 100)")
    tail.add_argument("--redis-url", default=None, help="Redis (default: FERRY_REDIS_URL, else "
                      "ferry up's, else redis://127.0.0.1:6379/0)")
    tail.add_argument("--state-dir", default=None, help="ferry up's state directory, where "
                      "it keeps its Redis's URL (default: FERRY_STATE_DIR, else the nearest "
                      ".ferry here or in a directory above)")


def count(text: str) -> int:
    """``-n``: 1 to 100."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= keys.LOG_RECENT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count from 1 to {keys.LOG_RECENT}")
    return value


def redis_environ(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the Redis settings are read from: ``environ``, and where it names no
    Redis (no ``FERRY_REDIS_URL`` nor ``FERRY_REDIS_SENTINELS``), ``ferry up``'s kept ones
    (its URL, and its sentinels, cluster or TLS files) beneath it."""
    if "FERRY_REDIS_URL" in environ or "FERRY_REDIS_SENTINELS" in environ:
        return dict(environ)
    saved = Path(args.state_dir) if args.state_dir else state_dir(environ)
    return redis_env(saved) | dict(environ)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
        ) -> int:
    out, err = out or sys.stdout, err or sys.stderr  # read now, not at import: a test
    # (capsys) or a caller may have replaced them
    try:
        settings = load(CommonSettings, None, redis_environ(args, os.environ))
    except ConfigError as exc:
        err.write(f"ferry log tail: {exc}\n")
        return 2
    if args.redis_url:
        settings = dataclasses.replace(settings, redis_url=args.redis_url)
    where = (f"the master {settings.redis_sentinel_master!r} of sentinels "
             f"{settings.redis_sentinels}" if settings.redis_sentinels
             else settings.redis_url)
    try:
        records, dropped = asyncio.run(latest(settings, args.model, args.n))
    except RedisError as exc:
        err.write(f"ferry log tail: Redis at {where}: {exc}\n")
        return 1
    for record in records:
        out.write(record.decode() + "\n")
    if not records:
        err.write(f"ferry log tail: no record of {args.model!r} in {where} (its tasks are "
                  "logged where FERRY_LOG_MODELS names it, from then on)\n")
    if dropped:
        err.write(f"ferry log tail: {dropped} record(s) of {args.model} dropped so far: its "
                  "log stream was at its bound (FERRY_LOG_MAX_RECORDS)\n")
    return 0


async def latest(settings: CommonSettings, model: str, n: int) -> tuple[list[bytes], int]:
    """The model's ``n`` latest records, oldest first, and its count of dropped records."""
    redis = lean(settings, "ferry-log-tail")
    try:
        newest_first, dropped = await redis.pipeline([
            ("XREVRANGE", keys.log_key(model, "recent"), "+", "-", "COUNT", n),
            ("GET", keys.log_key(model, "dropped"))])
    finally:
        await redis.close()
    field = keys.LOG_FIELD.encode()
    records = [dict(zip(f[::2], f[1::2], strict=True)).get(field, b"")
               for _, f in reversed(newest_first)]
    return [bytes(r) for r in records if r], int(dropped or 0)
