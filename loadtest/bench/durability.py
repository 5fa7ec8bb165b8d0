"""What durability costs: replica-acknowledged admission (WAIT) and ``appendfsync always``.

Four ways to run Redis under the same Ferry, round after round (the order turned each round, so
the machine's drift hits all alike), each at the same open-loop rates of POST then GET on the fast
simulated backend:

- one Redis, no replica (``FERRY_REDIS_MIN_REPLICAS=0``): the default, the baseline;
- a master with one replica, not waited for (0): what replication alone costs;
- the same, every admission confirmed by the replica (``FERRY_REDIS_MIN_REPLICAS=1``);
- one Redis with ``appendonly yes``, ``appendfsync always``: every write on disk before Redis
  answers, the single-node alternative.

Reported: medians over the rounds of p50, p99 and CPU per inference (gateway, batcher, Redis:
the replica's CPU included).

    .venv/bin/python -m loadtest.bench --only durability
"""

from __future__ import annotations

import datetime
import json
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

import redis

from ferry.stack.ports import LOOPBACK, free_port
from ferry.stack.redis_ha import RedisNode
from ferry.stack.triton_server import start_triton
from loadtest.bench.ab import Row, measure
from loadtest.bench.backends import FAST, Scenario, write_repository
from loadtest.bench.goodput import replace_section

HEADING = "## Durability: replica-acknowledged admission"
SERVICES = str(Path(__file__).resolve().parents[2] / "services")
FLOW = "ferry-2req"


@dataclass(frozen=True)
class Setup:
    """One way to run Redis, and the settings Ferry gets for it."""

    name: str
    replica: bool = False
    min_replicas: int = 0
    fsync_always: bool = False


SETUPS = (Setup("one Redis (baseline)"),
          Setup("master + replica, not waited for", replica=True),
          Setup("master + replica, FERRY_REDIS_MIN_REPLICAS=1", replica=True, min_replicas=1),
          Setup("one Redis, appendfsync always", fsync_always=True))


@dataclass
class Servers:
    """A Redis (with its replica) of one setup, for all its rounds."""

    nodes: list[RedisNode]

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.nodes[0].port}/0"

    @property
    def pids(self) -> list[int]:
        return [n.process.pid or 0 for n in self.nodes if n.process is not None]

    def flush(self) -> None:
        """Every round starts from an empty Redis (the last round's results gone)."""
        with redis.Redis.from_url(self.url) as client:
            client.flushall()
            client.execute_command("WAIT", len(self.nodes) - 1, 1000)


def start(setup: Setup, state: Path) -> Servers:
    master = RedisNode(free_port(), state / "master")
    if setup.fsync_always:
        master.extra = ["--appendonly", "yes", "--appendfsync", "always"]
    master.start()
    nodes = [master]
    if setup.replica:
        replica = RedisNode(free_port(), state / "replica",
                            ["--replicaof", LOOPBACK, str(master.port)])
        replica.start()
        nodes.append(replica)
    return Servers(nodes)


def run(state: Path, setups: tuple[Setup, ...], rates: list[float], rounds: int,
        seconds: float) -> dict[tuple[str, float], list[Row]]:
    """Every setup at every rate, ``rounds`` times, interleaved."""
    scenario = Scenario(FAST, 1)
    repository = write_repository(state / "models", [scenario], 50)
    triton, ports = start_triton(repository, state / "triton")
    servers = {s.name: start(s, state / f"redis-{i}") for i, s in enumerate(setups)}
    results: dict[tuple[str, float], list[Row]] = {}
    try:
        for round_ in range(rounds):
            order = setups if round_ % 2 == 0 else setups[::-1]
            for setup in order:
                server = servers[setup.name]
                server.flush()
                rows = measure(SERVICES, state, triton=f"{LOOPBACK}:{ports.grpc}",
                               triton_http=f"{LOOPBACK}:{ports.http}", redis_url=server.url,
                               redis_pid=server.pids, model=scenario.name,
                               rates=rates, seconds=seconds, seed=31 + round_, flow=FLOW,
                               env={"FERRY_REDIS_MIN_REPLICAS": str(setup.min_replicas)})
                for rate, row in rows.items():
                    results.setdefault((setup.name, rate), []).append(row)
    finally:
        for server in servers.values():
            for node in server.nodes:
                node.kill()
        triton.stop()
    return results


def lines(results: dict[tuple[str, float], list[Row]], setups: tuple[Setup, ...],
          rates: list[float], note: str) -> list[str]:
    """The section: a row per setup and rate, with its CPU and p99 against the baseline's."""
    out = [HEADING, "", note, "",
           "| Redis | rate (/s) | p50 (ms) | p99 (ms) | CPU per inference (µs): gateway + "
           "batcher + Redis | CPU / baseline | p99 - baseline (ms) |",
           "|---|---|---|---|---|---|---|"]
    for rate in rates:
        base = _median(results[(setups[0].name, rate)])
        for setup in setups:
            med = _median(results[(setup.name, rate)])
            out.append(f"| {setup.name} | {rate:g} | {med[0]:.1f} | {med[1]:.1f} | "
                       f"{med[2]:,.0f}: {med[3]:,.0f} + {med[4]:,.0f} + {med[5]:,.0f} | "
                       f"{med[2] / base[2]:.3f} | {med[1] - base[1]:+.1f} |")
    return out


def _median(runs: list[Row]) -> list[float]:
    return [statistics.median(r[i] for r in runs) for i in range(6)]


def write_section(out: Path, state: Path, quick: bool, command: str) -> None:
    """Measure and put the section in ``out`` (the report)."""
    started = datetime.datetime.now(datetime.UTC)
    rates, rounds, seconds = ([50.0], 1, 2.0) if quick else ([200.0, 400.0], 4, 10.0)
    setups = (SETUPS[0], SETUPS[2]) if quick else SETUPS  # a quick run: the baseline and WAIT
    folder = state / "durability"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    results = run(folder, setups, rates, rounds, seconds)
    (folder / "durability.json").write_text(json.dumps(
        [{"setup": name, "rate": rate, "rounds": runs} for (name, rate), runs in
         results.items()]))
    note = (f"Measured by `{command}` on {started:%Y-%m-%d %H:%M} UTC: {rounds} interleaved "
            f"rounds of {seconds:g} s per rate, POST then GET ?wait=10 (`{FLOW}`), the fast "
            "simulated backend (4 + 0.25 B ms), one gateway and one batcher process; medians "
            "over the rounds. `FERRY_REDIS_MIN_REPLICAS=1` adds a `WAIT` shared by the "
            "admissions answered while the one before it was out.")
    text = out.read_text() if out.exists() else ""
    out.write_text(replace_section(text, lines(results, setups, rates, note), HEADING))
