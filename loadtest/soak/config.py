"""A soak run's settings, from its command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.soak.plan import KINDS, Kind

MAX_DURATION_S = 24 * 3600.0
MAX_DRAIN_S = 600.0
MAX_RATE = 5000.0


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float = 60.0
    share: float = 0.5
    rate: float | None = None  # None: share x the capacity measured at start
    seed: int = 1
    fault_every_s: float = 8.0
    faults: tuple[Kind, ...] = KINDS
    drain_s: float = 60.0
    calibrate_s: float = 5.0
    memory_every_s: float = 3.0
    warmup_s: float = 10.0
    gateways: int = 2
    batchers: int = 2
    out: Path = Path("soak.json")
    state_dir: Path | None = None  # None: a new temporary folder (kept: it holds the logs)
    min_replicas_to_write: int = 0  # Redis's min-replicas-to-write on every node (0: off)
    redis_stop_s: float | None = None  # None: a stopped master wakes up once replaced
    redis_socket_timeout_s: float = 10.0  # Ferry's FERRY_REDIS_SOCKET_TIMEOUT_S (its default)
    min_replicas: int = 1  # Ferry's FERRY_REDIS_MIN_REPLICAS


def parse_faults(text: str) -> tuple[Kind, ...]:
    """``all``, ``none``, or kinds like ``kill-gateway,stop-redis``."""
    if text.strip() == "all":
        return KINDS
    if text.strip() == "none":
        return ()
    try:
        return tuple(Kind.parse(name) for name in text.split(",") if name.strip())
    except ValueError:
        names = ", ".join(k.name for k in KINDS)
        raise argparse.ArgumentTypeError(f"fault kinds are {names} (or all, none)") from None


DEFAULTS = SoakConfig()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.soak",
                                description="Chaos soak of a whole Ferry stack on loopback.")
    p.add_argument("--duration-s", type=float, default=DEFAULTS.duration_s,
                   help="seconds of load")
    p.add_argument("--share", type=float, default=DEFAULTS.share,
                   help="load as a share of capacity")
    p.add_argument("--rate", type=float, default=None,
                   help="requests per second (skips the capacity calibration)")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed,
                   help="seeds arrivals, faults and targets")
    p.add_argument("--fault-every-s", type=float, default=DEFAULTS.fault_every_s,
                   help="about one fault this often (0: none)")
    p.add_argument("--faults", type=parse_faults, default=DEFAULTS.faults,
                   help="fault kinds to draw from, e.g. kill-gateway,stop-redis (default all)")
    p.add_argument("--drain-s", type=float, default=DEFAULTS.drain_s,
                   help="longest wait for the accepted tasks to end after the load")
    p.add_argument("--calibrate-s", type=float, default=DEFAULTS.calibrate_s,
                   help="length of the calibration (after a 1 s warm-up)")
    p.add_argument("--memory-every-s", type=float, default=DEFAULTS.memory_every_s,
                   help="RSS sampling interval")
    p.add_argument("--warmup-s", type=float, default=DEFAULTS.warmup_s,
                   help="a process's life before its memory trend counts")
    p.add_argument("--redis-min-replicas-to-write", type=int,
                   default=DEFAULTS.min_replicas_to_write,
                   help="set Redis's min-replicas-to-write on every node (default 0: off, as "
                        "ferry.stack.redis_ha starts it): a master cut off from its replicas "
                        "then refuses writes")
    p.add_argument("--redis-stop-s", type=float, default=None,
                   help="how long a stopped Redis master stays stopped (default: until the "
                        "sentinels have replaced it and moved its replicas, and 2 s more)")
    p.add_argument("--redis-socket-timeout-s", type=float,
                   default=DEFAULTS.redis_socket_timeout_s,
                   help="FERRY_REDIS_SOCKET_TIMEOUT_S of every gateway and batcher (default "
                        "10, Ferry's): a connection to a hung master is dropped after this")
    p.add_argument("--min-replicas", type=int, default=DEFAULTS.min_replicas,
                   help="FERRY_REDIS_MIN_REPLICAS of every gateway and batcher (default 1; 0: "
                        "admissions answered without waiting for a replica)")
    p.add_argument("--gateways", type=int, default=DEFAULTS.gateways)
    p.add_argument("--batchers", type=int, default=DEFAULTS.batchers)
    p.add_argument("--out", type=Path, default=DEFAULTS.out, help="the JSON report")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="logs and data of the stack (default: a new temporary folder)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> SoakConfig:
    p = parser()
    args = p.parse_args(argv)
    if not 0 < args.duration_s <= MAX_DURATION_S or not 0 <= args.drain_s <= MAX_DRAIN_S:
        p.error(f"--duration-s must be in (0, {MAX_DURATION_S:g}], --drain-s in [0, "
                f"{MAX_DRAIN_S:g}]")
    if args.rate is not None and not 0 < args.rate <= MAX_RATE:
        p.error(f"--rate must be in (0, {MAX_RATE:g}]")
    if not 0 < args.share <= 1 or args.fault_every_s < 0 or args.memory_every_s <= 0:
        p.error("--share must be in (0, 1], --fault-every-s >= 0, --memory-every-s > 0")
    if not 0.5 <= args.redis_socket_timeout_s <= 60:
        p.error("--redis-socket-timeout-s must be in [0.5, 60]")
    if not 0 <= args.redis_min_replicas_to_write <= 2:
        p.error("--redis-min-replicas-to-write must be 0 to 2 (the group has two replicas)")
    if not 0 <= args.min_replicas <= 2:
        p.error("--min-replicas must be 0 to 2 (the group has two replicas)")
    if not 1 <= args.gateways <= 8 or not 1 <= args.batchers <= 8:
        p.error("--gateways and --batchers must be 1 to 8")
    return SoakConfig(
        duration_s=args.duration_s, share=args.share, rate=args.rate, seed=args.seed,
        fault_every_s=args.fault_every_s, faults=args.faults, drain_s=args.drain_s,
        calibrate_s=args.calibrate_s, memory_every_s=args.memory_every_s,
        warmup_s=args.warmup_s, gateways=args.gateways, batchers=args.batchers,
        out=args.out, state_dir=args.state_dir,
        min_replicas_to_write=args.redis_min_replicas_to_write,
        redis_stop_s=args.redis_stop_s, redis_socket_timeout_s=args.redis_socket_timeout_s,
        min_replicas=args.min_replicas)
