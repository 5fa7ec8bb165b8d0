"""Nothing reads the environment after start-up: each service's settings are built once, by
``ferry.settings.load``, and passed down. These few functions may touch ``os.environ`` too, each
for the reason written beside it; any other read (or a new one) fails here. The source is read,
never executed, as ``test_architecture`` reads it."""

from __future__ import annotations

import ast

from tests.unit.test_architecture import _sources  # every hand-written module, parsed

ENVIRONMENT = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})

ALLOWED = {
    # the settings loader: flags, FERRY_* variables and FERRY_FALLBACK_<MODEL>, once
    "ferry.settings.loading.load",
    # written, not read: the gateway's uvicorn workers rebuild the settings from FERRY_*
    "ferry.gateway.serve.serve",
    # prometheus_client's multiprocess directory, set before the gateway's workers start
    "ferry.gateway.serve._fresh_metrics_dir",
    # the same variable, read once as a gateway's metrics are built (the library reads it too)
    "ferry.telemetry.metrics.GatewayMetrics.__init__",
    # the standard OTEL_* variables, as a service builds its parts at start-up
    "ferry.telemetry.tracing.Tracing.__init__",
    # ferry up's children: the environment they inherit, PATH and LD_LIBRARY_PATH for Triton
    "ferry.stack.process.env_with",
    "ferry.stack.triton_server.triton_env",
    # one-shot command-line clients (no service, no settings): FERRY_URL, FERRY_API_KEY,
    # FERRY_ADMIN_TOKEN, FERRY_STATE_DIR as their command starts
    "ferry.jobs.cli.add_parser",
    "ferry.rollouts.cli.client_options",
    "ferry.rollouts.cli.token",
    "ferry.rollouts.cli.token_hint",
    "ferry.usage.cli.add_parser",
    # the same clients and ferry plan fit: ferry up's state directory (FERRY_STATE_DIR)
    "ferry.stack.state.state_dir",
    # ferry log tail: the FERRY_REDIS_* variables, read by ferry.settings.load as it starts
    "ferry.inference_log.cli.run",
    # ferry settings --effective: the environment a service would start with, shown (read as
    # ferry.settings.loading.load reads it, once)
    "ferry.cli._settings",
}


def _touches_environment(node: ast.AST) -> bool:
    """``os.environ``, ``os.getenv(...)`` and the like, or ``from os import environ``."""
    if isinstance(node, ast.Attribute):
        return (node.attr in ENVIRONMENT and isinstance(node.value, ast.Name)
                and node.value.id == "os")
    if isinstance(node, ast.ImportFrom):
        return node.module == "os" and any(a.name in ENVIRONMENT for a in node.names)
    return False


def readers(module: str, tree: ast.AST) -> set[str]:
    """Where in ``module`` the environment is touched: the enclosing function's dotted name
    (its class's included), or the module's own for code at import time."""
    found: set[str] = set()

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = f"{scope}.{node.name}"
        if _touches_environment(node):
            found.add(scope)
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, module)
    return found


def test_nothing_reads_the_environment_outside_start_up() -> None:
    found = {reader for module, tree in _sources() for reader in readers(module, tree)}
    assert sorted(found - ALLOWED) == []


def test_every_allowed_reader_still_reads() -> None:
    """A stale entry would let a new read in where the old one was."""
    found = {reader for module, tree in _sources() for reader in readers(module, tree)}
    assert sorted(ALLOWED - found) == []


def test_reads_are_found_however_written() -> None:
    source = ("import os\nfrom os import getenv\nX = os.environ.get('A')\n"
              "class C:\n    def m(self) -> str:\n        return os.getenv('B') or ''\n"
              "def f() -> None:\n    os.environ['C'] = '1'\n"
              "def g() -> str:\n    return 'os.environ'\n")
    assert readers("m", ast.parse(source)) == {"m", "m.C.m", "m.f"}
