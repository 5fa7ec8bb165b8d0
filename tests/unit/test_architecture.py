"""The tree keeps showing the architecture: these fail when it regresses.

Rooms are the first-level packages and modules under ``ferry`` (``batcher``, ``tasks``,
``keys``...). The import graph between rooms has no cycle; the services' inner rooms never
import the gateway; no function grows past 40 lines. Imports are read from the source (every
``import``, in functions and ``TYPE_CHECKING`` blocks too), never executed, except for the one
check that a batcher process loads no gateway module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

FERRY = Path(__file__).resolve().parents[2] / "services" / "ferry"
GENERATED = ("v1", "model_repository")  # protobuf and Triton model code, not written here
MAX_FUNCTION_LINES = 40
BELOW_THE_GATEWAY = ("batcher", "tasks", "queue", "rules", "triton", "resp", "jobs",
                     "rollouts", "oip", "submission")
# One Redis client: Ferry's own, ``resp`` (hiredis parses its replies; redis-py lends it only
# the slot of a key). Nothing else imports a Redis driver.
REDIS_DRIVERS = ("redis", "hiredis")
REDIS_ADAPTERS = ("ferry.resp",)


def _sources() -> Iterator[tuple[str, ast.Module]]:
    """Every hand-written module: its dotted name and its syntax tree."""
    for path in sorted(FERRY.rglob("*.py")):
        relative = path.relative_to(FERRY)
        if relative.parts[0] in GENERATED:
            continue
        parts = ("ferry", *relative.with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(), str(path))


@cache
def _modules() -> dict[str, ast.Module]:
    return dict(_sources())


def _imported(module: str, tree: ast.Module) -> set[str]:
    """The ``ferry`` modules a module imports (``from ferry import keys`` names ferry.keys)."""
    names: set[str] = set()
    package = module if (FERRY / Path(*module.split(".")[1:]) / "__init__.py").exists() \
        else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package upwards
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n in _modules() and n != module}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ferry"


def _room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, tree in _modules().items():
        room = _room(module)
        graph.setdefault(room, set()).update(
            r for r in map(_room, _imported(module, tree)) if r != room)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one room (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(room: str) -> None:
        index[room] = low[room] = len(index)
        stack.append(room)
        for other in sorted(graph.get(room, ())):
            if other not in index:
                visit(other)
                low[room] = min(low[room], low[other])
            elif other in stack:
                low[room] = min(low[room], index[other])
        if low[room] == index[room]:
            group = []
            while (member := stack.pop()) != room:
                group.append(member)
            group.append(room)
            if len(group) > 1:
                groups.append(sorted(group))

    for room in sorted(graph):
        if room not in index:
            visit(room)
    return groups


def test_the_rooms_below_the_gateway_never_import_it() -> None:
    offenders = sorted(
        f"{module} imports {name}" for module, tree in _modules().items()
        if _room(module) in BELOW_THE_GATEWAY
        for name in _imported(module, tree) if _room(name) == "gateway")
    assert offenders == []


def test_the_rooms_import_each_other_without_a_cycle() -> None:
    graph = _room_graph()
    assert {"batcher", "compose", "gateway", "tasks", "queue"} <= set(graph)  # it reads them
    assert _cycles(graph) == []


def test_a_cycle_is_found_however_long() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_composition_root_imports_no_service() -> None:
    """``ferry.compose`` builds parts for the services and is called by them and the entry
    points: were it to import a service, that service and compose would form a cycle."""
    imported = {_room(name) for module, tree in _modules().items() if _room(module) == "compose"
                for name in _imported(module, tree)}
    assert not imported & {"batcher", "gateway", "cli", "stack"}


def test_settings_import_no_feature_package() -> None:
    """Settings sit below what they configure: the values and parsers a setting needs live in
    ``settings/``, and the features import them from there. Its modules import only each other
    and two leaf utilities, ``ferry.errors`` and ``ferry.durations`` (imports in functions and
    ``TYPE_CHECKING`` blocks count: ``_imported`` reads them all)."""
    leaves = {"ferry.errors", "ferry.durations"}
    imported = {(module, name) for module, tree in _modules().items()
                if _room(module) == "settings" for name in _imported(module, tree)}
    assert {name for _, name in imported} >= leaves  # it reads them
    assert sorted(f"{module} imports {name}" for module, name in imported
                  if _room(name) != "settings" and name not in leaves) == []


def test_no_function_is_longer_than_40_lines() -> None:
    long = sorted(
        f"{module}.{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for module, tree in _modules().items() for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES)
    assert long == []


@pytest.mark.parametrize("entry", ["ferry.cli", "ferry.batcher.supervisor",
                                   "ferry.batcher.worker", "ferry.compose.batcher"])
def test_a_batcher_process_loads_no_gateway_module(entry: str) -> None:
    """What ``ferry batcher`` imports, run in a fresh interpreter: no gateway module, nor the
    gateway's access rules or composition, is loaded."""
    probe = (f"import sys, {entry}; print(sorted(m for m in sys.modules "
             "if m.startswith(('ferry.gateway', 'ferry.access', 'ferry.compose.gateway'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                            text=True, timeout=60).stdout.strip()
    assert loaded == "[]"


def _self_uses(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str] | None:
    """The attributes of ``self`` a method reads or writes (its fields and its sibling
    methods); None if it hands ``self`` itself on (``return self``, ``Helper(self)``): it
    works with the whole object, so it tells nothing of how the object parts."""
    names = {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Name) and node.value.id == "self"}
    bare = sum(isinstance(node, ast.Name) and node.id == "self" for node in ast.walk(function))
    through = sum(isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "self" for node in ast.walk(function))
    return None if bare > through else names


def _bindings(init: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, set[str]]:
    """What each field set in ``__init__`` is made of (``self.routes = {..: self._submit}``
    ties ``routes`` to ``_submit``)."""
    bound: dict[str, set[str]] = {}
    for node in ast.walk(init):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            used = {each.attr for each in ast.walk(node.value) if isinstance(each, ast.Attribute)
                    and isinstance(each.value, ast.Name) and each.value.id == "self"}
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    bound.setdefault(target.attr, set()).update(used)
    return bound


def _responsibilities(cls: ast.ClassDef) -> list[list[str]]:
    """The groups of a class's methods that share no field nor call (LCOM4: Hitz and Montazeri,
    1995): one group is one reason to change; each more is a class hiding inside it.
    ``__init__``, static or class methods and those that hand ``self`` on join no group."""
    uses: dict[str, set[str] | None] = {}
    bound: dict[str, set[str]] = {}
    for item in cls.body:
        if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if item.name == "__init__":
            bound = _bindings(item)
        elif not any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")
                     for d in item.decorator_list):
            uses[item.name] = _self_uses(item)
    reach = {name: used | {b for u in used for b in bound.get(u, ())}
             for name, used in uses.items() if used is not None}
    groups: list[tuple[set[str], set[str]]] = []
    for name, used in reach.items():
        joined = [g for g in groups if name in g[1] or used & (g[0] | g[1])]
        members, fields = {name}, used
        for group in joined:
            groups.remove(group)
            members, fields = members | group[0], fields | group[1]
        groups.append((members, fields))
    return sorted(sorted(members) for members, _ in groups)


def _ports() -> set[str]:
    """The names of the tree's ports: its classes that are a ``Protocol``."""
    return {node.name for tree in _modules().values() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases)}


def test_the_gateways_classes_each_have_one_reason_to_change() -> None:
    """A coordinator of the gateway is one piece of work: its methods share what they work
    on. A method that shares nothing with the others (the admin token's check in the
    rollouts' operations, as it was) is another class's, whatever the class's size: the
    count of methods, capped at 15 until 2026-11-28, measured size, and code was trimmed to
    it rather than split where it parts. A port, and an adapter that declares the port it
    implements (``GatewayTasks(Tasks)``: each of its methods done by another part), change
    with the port: they are judged by it."""
    ports = _ports()
    split = sorted(
        f"{module}.{node.name}: {groups}" for module, tree in _modules().items()
        if _room(module) == "gateway"
        for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
        if not any(isinstance(b, ast.Name) and b.id in {*ports, "Protocol"} for b in node.bases)
        if len(groups := _responsibilities(node)) > 1)
    assert split == []


def test_a_class_of_two_responsibilities_is_seen() -> None:
    tree = ast.parse(
        "class A:\n"
        "    def __init__(self):\n        self.routes = {'x': self._x}\n"
        "    def serve(self):\n        return self.routes\n"
        "    def _x(self):\n        return self.store\n"
        "    def check(self, token):\n        return self.token == token\n"
        "    def __enter__(self):\n        return self\n"
        "    @staticmethod\n    def helper():\n        return 1\n"
        "class B:\n"
        "    def a(self):\n        return self.x\n"
        "    def b(self):\n        return self.y\n")
    first, second = (node for node in tree.body if isinstance(node, ast.ClassDef))
    assert _responsibilities(first) == [["_x", "serve"], ["check"]]
    assert _responsibilities(second) == [["a"], ["b"]]


def _through_the_gateway(tree: ast.Module) -> set[str]:
    """Every use of a part reached through a ``Gateway`` (``gateway.catalog.metadata``,
    ``self.gateway.parts.hot``): the object named ``gateway``, then two attributes."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            base = node.value.value
            if (isinstance(base, ast.Name) and base.id == "gateway") or (
                    isinstance(base, ast.Attribute) and base.attr == "gateway"):
                found.add(ast.unparse(node))
    return found


def test_no_part_is_reached_through_the_gateway() -> None:
    """``Gateway`` holds the operations its routes call, not the gateway's parts:
    ``gateway.assembly`` makes them and ``create_app`` hands each route those it works with.
    Nothing reaches a part through the gateway, and its constructor makes nothing."""
    reached = sorted(f"{module}: {use}" for module, tree in _modules().items()
                     for use in _through_the_gateway(tree))
    assert reached == []
    service = _modules()["ferry.gateway.service"]
    (init,) = (item for node in service.body if isinstance(node, ast.ClassDef)
               and node.name == "Gateway" for item in node.body
               if isinstance(item, ast.FunctionDef) and item.name == "__init__")
    assert [ast.unparse(call) for call in ast.walk(init) if isinstance(call, ast.Call)] == []


def test_a_part_reached_through_the_gateway_is_seen() -> None:
    tree = ast.parse("gateway.parts.hot\nself.gateway.catalog.metadata(m)\n"
                     "gateway.submit(x)\nroom.parts.hot\n")
    assert _through_the_gateway(tree) == {"gateway.parts.hot", "self.gateway.catalog.metadata"}


def _drivers_imported(tree: ast.Module) -> set[str]:
    """The Redis driver modules a module imports (absolute imports of ``REDIS_DRIVERS``)."""
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and not node.level}
    return {name for name in names if name.split(".")[0] in REDIS_DRIVERS}


def test_only_the_redis_client_imports_a_redis_driver() -> None:
    """One Redis client, whose replies are Ferry's errors as they are parsed (``ferry.errors``:
    transient ``RedisUnavailableError`` or permanent ``RedisCommandError``), so no caller
    catches, or needs, a driver's class."""
    offenders = sorted(
        f"{module} imports {name}" for module, tree in _modules().items()
        if not any(module == a or module.startswith(f"{a}.") for a in REDIS_ADAPTERS)
        for name in _drivers_imported(tree))
    assert offenders == []


def test_a_driver_import_is_seen_however_written() -> None:
    tree = ast.parse("import redis.asyncio as aioredis\nfrom redis.exceptions import "
                     "ResponseError\nimport hiredis\nfrom ferry import redis_conn\n"
                     "from .redis import x\ndef f() -> None:\n    from redis import crc\n")
    assert _drivers_imported(tree) == {"redis.asyncio", "redis.exceptions", "hiredis", "redis"}


# Attributes set on another object's attribute that are allowed: data, not collaborators (a
# protobuf message, the planner's simulated entities). The batcher's loops share state whose
# pieces each have an owner with methods (``batcher/shared.py``): none of its fields is set
# from outside.
ASSIGNED_THROUGH = {
    ("ferry.gateway.prepare", "envelope.task.model_version"),
    ("ferry.planner.simulate", "self.budget.in_flight"),
    ("ferry.planner.simulate", "batch.batcher.idle_until"),
    ("ferry.planner.simulate", "batch.batcher.in_flight"),
    ("ferry.planner.simulate", "batch.batcher.batch_work_until"),
}


def _assigned_through(tree: ast.Module) -> set[str]:
    """Every assignment target that sets an attribute of an attribute (``a.b.c = ...``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(each, ast.Attribute) and isinstance(each.value, ast.Attribute):
                    found.add(ast.unparse(each))
    return found


def test_no_collaborator_is_wired_after_construction() -> None:
    """Objects get what they work with when they are made (a constructor's argument), never by
    an assignment through another object afterwards (``parts.cancels.on_message = ...``,
    ``executor.desk = ...``): what an object depends on is read in its constructor. (A
    local's attribute, ``waiters.channels = ...``, cannot be told from a message's field here:
    only assignments two attributes deep are checked.)"""
    found = {(module, target) for module, tree in _modules().items()
             for target in _assigned_through(tree)}
    assert sorted(found - ASSIGNED_THROUGH) == []
    assert sorted(ASSIGNED_THROUGH - found) == []  # an exception no longer needed goes


def test_an_assignment_through_another_object_is_seen_however_written() -> None:
    tree = ast.parse("a.b.c = 1\nx.y = 2\nself.p.q += 1\nm.n.o: int = 3\n"
                     "(u.v.w, z) = 1, 2\nself.x = 4\n")
    assert _assigned_through(tree) == {"a.b.c", "self.p.q", "m.n.o", "u.v.w"}
