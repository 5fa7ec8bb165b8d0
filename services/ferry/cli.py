"""The ``ferry`` command: ``ferry up``, ``ferry gateway``, ``ferry batcher``, ``ferry logger``,
``ferry settings``, ``ferry keys new``, ``ferry plan fit|size|curve``, ``ferry jobs
submit|status|results|...``, ``ferry rollout status|set|promote|rollback|compare|decisions``,
``ferry usage``, ``ferry log tail``.

A subcommand's arguments, and the modules that define them, are loaded for the subcommand given
only: ``ferry --help`` and a light subcommand import neither the services nor the planner, nor
the HTTP client. Ctrl-C ends a client command (its work cut short) with exit code 130 and one
line on stderr; the services (``up``, ``gateway``, ``batcher``, ``logger``) take it as a request
to stop, stop gracefully and exit 0, as on SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ferry import __version__

if TYPE_CHECKING:
    from ferry.settings import BatcherSettings, CommonSettings
    from ferry.settings.services import LoggerSettings

SERVICES = ("up", "gateway", "batcher", "logger")
# Each subcommand's line in ``ferry --help``. plan, jobs and rollout give the same line to their
# own parsers, which are built only when they run.
SUMMARIES = {
    "up": "run the whole stack locally: Redis, Triton, gateway, batcher",
    "gateway": "run the HTTP gateway",
    "batcher": "run a batcher worker",
    "logger": "run the inference log's logger: sampled records to files or a collector",
    "settings": "print every setting as a Markdown table; --effective SERVICE: the values in "
                "effect here",
    "keys": "API keys for FERRY_AUTH=api_key",
    "plan": "fit a model's batch cost, simulate Ferry's policy, size a deployment",
    "jobs": "bulk jobs: submit, follow, collect",
    "rollout": "model versions: status, set, promote, rollback, compare, decisions",
    "usage": "what each client cost: tasks, rows, GPU seconds",
    "log": "the inference log: a model's latest records",
}
# The commands that are clients (of the planner or a gateway): each module's add_parser and run.
CLIENTS = {"plan": "ferry.planner.command", "jobs": "ferry.jobs.cli",
           "rollout": "ferry.rollouts.cli", "usage": "ferry.usage.cli",
           "log": "ferry.inference_log.cli"}
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for ``argv``: every subcommand named, only the one ``argv`` gives (if any)
    with its arguments."""
    parser = argparse.ArgumentParser(
        prog="ferry", description="Batch inference requests for NVIDIA Triton. Every flag is "
        "also a FERRY_* environment variable; flags win.")
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    given = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, summary in SUMMARIES.items():
        if name == "settings" and name == given:
            _add_settings(commands, argv)
        elif name == given:
            _full_parser(name)(commands)
        else:
            commands.add_parser(name, help=summary)
    return parser


def _full_parser(name: str) -> Callable[[Any], None]:
    """What adds subcommand ``name`` with its arguments to the subparsers."""
    if name in SERVICES:
        return lambda commands: _add_service(commands, name)
    if name == "keys":
        return _add_keys
    if name in CLIENTS:
        return cast(Callable[[Any], None], importlib.import_module(CLIENTS[name]).add_parser)
    return lambda commands: commands.add_parser(name, help=SUMMARIES[name])


def _add_service(commands: Any, name: str) -> None:
    from ferry.settings import add_arguments

    summary = SUMMARIES[name]
    add_arguments(commands.add_parser(name, help=summary, description=summary),
                  _settings_class(name))


def _add_settings(commands: Any, argv: Sequence[str]) -> None:
    """``ferry settings [--effective SERVICE [its flags]]``: the service's flags are those of
    the service named after ``--effective`` in ``argv`` (none before one is named)."""
    from ferry.settings import add_arguments

    parser = commands.add_parser(
        "settings", help=SUMMARIES["settings"], description="Without --effective: every "
        "setting, its default and meaning (docs/configuration.md). With --effective SERVICE: "
        "the settings `ferry SERVICE` would run with here (its flags, FERRY_* variables and "
        "FERRY_*_FILE files; secrets masked), or the error it would stop on (exit code 2).")
    parser.add_argument("--effective", choices=SERVICES, metavar="SERVICE",
                        help=f"one of {', '.join(SERVICES)}; then that service's flags")
    service = _effective_service(argv)
    if service in SERVICES:
        add_arguments(parser, _settings_class(service))


def _effective_service(argv: Sequence[str]) -> str | None:
    """The word after ``--effective`` (or in ``--effective=SERVICE``), if any."""
    for index, arg in enumerate(argv):
        if arg.startswith("--effective="):
            return arg.partition("=")[2]
        if arg == "--effective" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def _settings_class(name: str) -> type[CommonSettings]:
    from ferry.settings import BatcherSettings, GatewaySettings, UpSettings
    from ferry.settings.services import LoggerSettings

    classes: dict[str, type[CommonSettings]] = {
        "up": UpSettings, "gateway": GatewaySettings, "batcher": BatcherSettings,
        "logger": LoggerSettings}
    return classes[name]


def _add_keys(commands: Any) -> None:
    keys = commands.add_parser("keys", help=SUMMARIES["keys"])
    actions = keys.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="make a key for a client: prints the key once, and "
                             "the FERRY_API_KEYS entry that holds only its hash")
    new.add_argument("--client", required=True, help="the client id the key proves")


def new_api_key(client: str) -> int:
    from ferry.auth import api_keys
    from ferry.auth.base import CLIENT_ID

    if not CLIENT_ID.fullmatch(client):
        print("ferry keys new: --client must be 1-128 letters, digits or ._:@/+=-")
        return 2
    key = api_keys.new_key()
    print(f"API key for {client} (shown once; Ferry keeps only its hash):\n  {key}\n"
          "Add this entry to FERRY_API_KEYS (comma-separated) or a line of "
          f"FERRY_API_KEYS_FILE:\n  {api_keys.config_line(client, key)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ferry`` with ``argv`` (default: the process's arguments); its exit code."""
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(given)
    except KeyboardInterrupt:  # Ctrl-C: what was under way has stopped; no traceback
        print(f"{_name(given)}: interrupted", file=sys.stderr)
        return INTERRUPTED


def _name(argv: list[str]) -> str:
    """``ferry plan size``: the command and, right after it, its action (an option's value
    is no action, so none is named past an option)."""
    words = ["ferry"]
    for arg in argv:
        if arg.startswith("-") or len(words) == 3:
            break
        words.append(arg)
    return " ".join(words)


def _main(argv: list[str]) -> int:
    args = build_parser(argv).parse_args(argv)
    if args.command == "settings":
        return _settings(args)
    if args.command == "keys":
        return new_api_key(args.client)
    if args.command in CLIENTS:
        return _client(args.command)(args)
    return _service(args)


def _settings(args: argparse.Namespace) -> int:
    """The reference table; or with ``--effective``, the service's settings in effect here."""
    from ferry.errors import ConfigError
    from ferry.settings import effective_table, reference_table

    if not args.effective:
        print(reference_table())
        return 0
    try:
        print(effective_table(_settings_class(args.effective), args, os.environ))
    except ConfigError as exc:  # as the service itself would stop, on stderr: stdout is data
        print(f"ferry settings: {exc}", file=sys.stderr)
        return 2
    return 0


def _client(name: str) -> Callable[[argparse.Namespace], int]:
    """The ``run`` of a command that is a client (of the planner or a gateway)."""
    return cast(Callable[[argparse.Namespace], int], importlib.import_module(CLIENTS[name]).run)


def _service(args: argparse.Namespace) -> int:
    from ferry.errors import ConfigError, StartupError
    from ferry.settings import load
    from ferry.telemetry.logs import apply

    try:
        settings = load(_settings_class(args.command), args)
    except ConfigError as exc:
        print(f"ferry {args.command}: {exc}")
        return 2
    apply(settings.log_levels)
    try:
        return run(args.command, settings)
    except StartupError as exc:  # a port in use, say: one line, as ferry up says it
        print(f"ferry {args.command}: {exc}", file=sys.stderr)
        return 1


def run(command: str, settings: CommonSettings) -> int:
    """Run the command's service. Each service's modules are imported here, for its command
    only: a batcher process never loads the gateway's modules, nor a gateway the batcher's."""
    from ferry.errors import ConfigError
    from ferry.settings import BatcherSettings, GatewaySettings, UpSettings
    from ferry.settings.services import LoggerSettings

    if isinstance(settings, UpSettings):
        from ferry.stack.up import LocalStack

        return LocalStack(settings).run()
    if isinstance(settings, GatewaySettings):
        from ferry.gateway.serve import serve

        return serve(settings)
    if isinstance(settings, BatcherSettings):
        return run_batcher(settings)
    if isinstance(settings, LoggerSettings):
        return run_logger(settings)
    raise ConfigError(f"unknown command {command}")


def run_batcher(settings: BatcherSettings) -> int:
    """One batcher on its parts, or a supervisor of one when partitions follow replicas."""
    import uvloop

    from ferry.batcher.supervisor import Supervisor
    from ferry.batcher.worker import Batcher
    from ferry.compose.batcher import batcher_parts

    def build(settings: BatcherSettings) -> Batcher:
        return Batcher(batcher_parts(settings))

    if settings.follows_replicas:
        return uvloop.run(Supervisor(settings, factory=build).run())
    return uvloop.run(build(settings).run())


def run_logger(settings: LoggerSettings) -> int:
    """The inference log's logger, on its parts."""
    import uvloop

    from ferry.compose.logger import build_logger
    from ferry.errors import ConfigError

    try:
        logger = build_logger(settings)
    except ConfigError as exc:  # as a setting it refuses: one line, exit code 2
        print(f"ferry logger: {exc}")
        return 2
    return uvloop.run(logger.run())
