"""The ``ferry`` command: ``ferry up``, ``ferry gateway``, ``ferry batcher``, ``ferry settings``,
``ferry keys new``, ``ferry plan fit|size|curve``, ``ferry jobs submit|status|results|...``,
``ferry rollout status|set|promote|rollback|compare|decisions``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvloop

from ferry import __version__
from ferry.auth import api_keys
from ferry.auth.base import CLIENT_ID
from ferry.errors import ConfigError
from ferry.jobs import client as job_client
from ferry.planner import command as planner
from ferry.rollouts import client as rollout_client
from ferry.settings import (
    BatcherSettings,
    CommonSettings,
    GatewaySettings,
    UpSettings,
    add_arguments,
    load,
    reference_table,
)
from ferry.stack.up import LocalStack
from ferry.telemetry.logs import configure

COMMANDS: dict[str, tuple[type[CommonSettings], str]] = {
    "up": (UpSettings, "run the whole stack locally: Redis, Triton, gateway, batcher"),
    "gateway": (GatewaySettings, "run the HTTP gateway"),
    "batcher": (BatcherSettings, "run a batcher worker"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry", description="Batch inference requests for NVIDIA Triton. Every flag is "
        "also a FERRY_* environment variable; flags win.")
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (cls, help_text) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=help_text, description=help_text), cls)
    commands.add_parser("settings", help="print every setting as a Markdown table")
    keys = commands.add_parser("keys", help="API keys for FERRY_AUTH=api_key")
    actions = keys.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="make a key for a client: prints the key once, and "
                             "the FERRY_API_KEYS entry that holds only its hash")
    new.add_argument("--client", required=True, help="the client id the key proves")
    planner.add_parser(commands)
    job_client.add_parser(commands)
    rollout_client.add_parser(commands)
    return parser


def new_api_key(client: str) -> int:
    if not CLIENT_ID.fullmatch(client):
        print("ferry keys new: --client must be 1-128 letters, digits or ._:@/+=-")
        return 2
    key = api_keys.new_key()
    print(f"API key for {client} (shown once; Ferry keeps only its hash):\n  {key}\n"
          "Add this entry to FERRY_API_KEYS (comma-separated) or a line of "
          f"FERRY_API_KEYS_FILE:\n  {api_keys.config_line(client, key)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "settings":
        print(reference_table())
        return 0
    if args.command == "keys":
        return new_api_key(args.client)
    clients = {"plan": planner.run, "jobs": job_client.run, "rollout": rollout_client.run}
    if args.command in clients:
        return clients[args.command](args)
    cls, _ = COMMANDS[args.command]
    try:
        settings = load(cls, args)
    except ConfigError as exc:
        print(f"ferry {args.command}: {exc}")
        return 2
    configure(settings.log_level)
    return run(args.command, settings)


def run(command: str, settings: CommonSettings) -> int:
    """Run the command's service. Each service's modules are imported here, for its command
    only: a batcher process never loads the gateway's modules, nor a gateway the batcher's."""
    if isinstance(settings, UpSettings):
        return LocalStack(settings).run()
    if isinstance(settings, GatewaySettings):
        from ferry.gateway.serve import serve

        return serve(settings)
    if isinstance(settings, BatcherSettings):
        return run_batcher(settings)
    raise ConfigError(f"unknown command {command}")


def run_batcher(settings: BatcherSettings) -> int:
    """One batcher on its parts, or a supervisor of one when partitions follow replicas."""
    from ferry.batcher.supervisor import Supervisor
    from ferry.batcher.worker import Batcher
    from ferry.compose.batcher import batcher_parts

    def build(settings: BatcherSettings) -> Batcher:
        return Batcher(batcher_parts(settings))

    if settings.owned_partitions.strip().lower() == "auto":
        return uvloop.run(Supervisor(settings, factory=build).run())
    return uvloop.run(build(settings).run())
