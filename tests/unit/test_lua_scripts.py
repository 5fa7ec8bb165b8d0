"""Every Lua script of the package, read without Redis: found by scanning the package (each
room's ``ScriptSpec`` values and ``lua/`` folders), every name a script uses is declared (by the
Python side's NamedTuples, the generated constants, or the script itself), every declared name
is used, no script indexes KEYS or ARGV by number, key names come only from ``keys.py``, and no
Lua is left inline in Python."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import re
import tomllib
from pathlib import Path

import pytest

from ferry import lua
from ferry.lua import ScriptSpec
from ferry.tasks import scripts
from ferry.tasks.base import CancelOutcome

ROOT = Path(__file__).resolve().parents[2]
FERRY = ROOT / "services" / "ferry"
LUA_KEYWORDS = frozenset({"and", "break", "do", "else", "elseif", "end", "false", "for",
                          "function", "if", "in", "local", "nil", "not", "or", "repeat",
                          "return", "then", "true", "until", "while"})
LUA_GLOBALS = frozenset({"redis", "string", "table", "math", "tonumber", "tostring", "type",
                         "pcall", "ipairs", "pairs", "unpack", "KEYS", "ARGV"})
MAX_LINES = 40
IDENTIFIER = re.compile(r"(?<![.:\w])[A-Za-z_]\w*")
STRING_OR_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"",
                               re.DOTALL)


def _module_name(path: Path) -> str:
    parts = path.relative_to(FERRY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _declared_scripts() -> list[ScriptSpec]:
    """Every ``ScriptSpec`` a module of the package holds, from the modules that name the
    class (imported: a spec is built from its room's NamedTuples and enums)."""
    found: dict[tuple[str, str], ScriptSpec] = {}
    for path in sorted(FERRY.rglob("*.py")):
        if path.name != "lua.py" and "ScriptSpec" in path.read_text():
            module = importlib.import_module(_module_name(path))
            found |= {(v.package, v.name): v for v in vars(module).values()
                      if isinstance(v, ScriptSpec)}
    return sorted(found.values(), key=lambda spec: (spec.package, spec.name))


SCRIPTS = _declared_scripts()
FRAGMENTS = sorted({lua.fragment(spec.package, f) for spec in SCRIPTS for f in spec.fragments})
FILES = sorted({(spec.package, spec.name) for spec in SCRIPTS} | set(FRAGMENTS))


def ident(spec: ScriptSpec) -> str:
    return f"{spec.package.rpartition('.')[2]}/{spec.name}"


def file_id(file: tuple[str, str]) -> str:
    return f"{file[0].rpartition('.')[2]}/{file[1]}"


def header(lua_text: str) -> str:
    """A script's leading comment: its contract."""
    lines = lua_text.splitlines()
    return "\n".join(lines[:next(i for i, line in enumerate(lines)
                                 if not line.startswith("--"))])


def code(text: str) -> str:
    """The Lua without comments, and with every string literal emptied (lines kept)."""
    return STRING_OR_COMMENT.sub(lambda m: "''" if m.group()[0] in "'\"" else "", text)


def declared_in(lua: str) -> set[str]:
    """Names a chunk declares: locals, functions, their parameters, loop variables."""
    names: set[str] = set()
    for pattern in (r"local\s+function\s+(\w+)", r"local\s+([\w\s,]+?)\s*(?:=|\n)",
                    r"function\s*\w*\s*\(([\w\s,]*)\)", r"for\s+([\w\s,]+?)\s+(?:in|=)"):
        for found in re.findall(pattern, lua):
            names.update(n.strip() for n in found.split(",") if n.strip())
    names.discard("function")
    return names


def used_in(lua: str) -> set[str]:
    return {name for name in IDENTIFIER.findall(lua) if name not in LUA_KEYWORDS}


def test_the_scan_finds_every_room_s_scripts() -> None:
    rooms = {spec.package for spec in SCRIPTS}
    assert rooms >= {"ferry.tasks", "ferry.jobs", "ferry.auth", "ferry.queue", "ferry.rollouts",
                     "ferry.batcher"}
    assert len(SCRIPTS) >= len(scripts.SCRIPTS) + 13  # the task store's, and the rooms' 13


def test_every_lua_file_is_a_declared_script_or_a_fragment() -> None:
    on_disk = {(_module_name(path.parent.parent / "__init__.py"), path.stem)
               for path in FERRY.rglob("*.lua")}
    assert on_disk == set(FILES)


def _lua_strings(tree: ast.Module) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and "redis.call(" in node.value]


def _registered(tree: ast.Module) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "register_script"]


def test_no_lua_is_left_inline_and_every_script_is_registered_through_the_loader() -> None:
    inline, elsewhere = [], []
    for path in sorted(FERRY.rglob("*.py")):
        relative = path.relative_to(FERRY)
        if relative.parts[0] in ("resp", "v1", "model_repository"):  # the clients themselves
            continue
        tree = ast.parse(path.read_text(), str(path))
        inline += [f"{relative}:{line}" for line in _lua_strings(tree)]
        elsewhere += [f"{relative}:{call.lineno}" for call in _registered(tree)
                      if ast.unparse(call.args[0]).split("(")[0] != "lua.source"]
    assert inline == [], "Lua in a Python string: move it to a room's lua/ folder"
    assert elsewhere == [], "a script registered other than as lua.source(spec)"


@pytest.mark.parametrize("spec", SCRIPTS, ids=ident)
def test_every_name_a_script_uses_is_declared(spec: ScriptSpec) -> None:
    whole = code(lua.source(spec))
    undeclared = used_in(whole) - declared_in(whole) - LUA_GLOBALS
    assert not undeclared, f"{spec.name}.lua uses undeclared names: {sorted(undeclared)}"


@pytest.mark.parametrize("spec", SCRIPTS, ids=ident)
def test_every_declared_key_and_argument_is_used(spec: ScriptSpec) -> None:
    used = used_in(code(lua.read_lua(spec.package, spec.name)))
    offsets = {name.upper() for name in spec.item}
    named = [*spec.keys, *spec.args, *spec.each[0], *spec.each[1]]
    unused = {*named, *offsets} - used
    assert not unused, f"{spec.name}.lua declares but never uses: {sorted(unused)}"
    assert len({*named, *offsets}) == len(named) + len(offsets), "a name is declared twice"
    assert not set(named) & (LUA_GLOBALS | LUA_KEYWORDS), "a name hides Lua's"


@pytest.mark.parametrize("spec", SCRIPTS, ids=ident)
def test_scripts_index_keys_and_argv_only_through_generated_names(spec: ScriptSpec) -> None:
    for package, name in (*(lua.fragment(spec.package, f) for f in spec.fragments),
                          (spec.package, spec.name)):
        lua_code = code(lua.read_lua(package, name))
        assert not re.search(r"\b(?:KEYS|ARGV)\[\s*\d", lua_code), f"{name}.lua"
    if spec.item:  # per-item ARGV: from the first item on, by its offsets
        first = "NAMED_ARGS" if spec.each[0] else "FIRST_ITEM"  # after the groups' ARGV
        assert first in lua.read_lua(spec.package, spec.name)
    if spec.each[0]:  # per-item KEYS and ARGV bound to their names
        assert "bind(" in lua.read_lua(spec.package, spec.name)
    if spec.more_keys:
        assert spec.more_keys in lua.read_lua(spec.package, spec.name)


@pytest.mark.parametrize("file", FILES, ids=file_id)
def test_scripts_build_no_key_names_of_their_own(file: tuple[str, str]) -> None:
    text = lua.read_lua(*file)
    for literal in ("'task:", "'webhooks'", "'followers:", "'cache:", "ferry:", "{p", "'idem:",
                    "'jobs:", "'{rollouts}"):
        assert literal not in text, f"{file[1]}.lua spells a key name: {literal}"


def blocks(text: str) -> list[tuple[int, int]]:
    """(first line, last line) of each function, by its ``function``...``end`` nesting."""
    spans: list[tuple[int, int]] = []
    stack: list[tuple[str, int]] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        for word in re.findall(r"\b(function|if|do|end)\b", line):
            if word == "end":
                kind, start = stack.pop()
                if kind == "function":
                    spans.append((start, line_no))
            else:
                stack.append((word, line_no))
    assert not stack, "unbalanced blocks"
    return spans


@pytest.mark.parametrize("file", FILES, ids=file_id)
def test_no_function_or_main_chunk_is_over_forty_lines(file: tuple[str, str]) -> None:
    text = code(lua.read_lua(*file))
    spans = blocks(text)
    for start, end in spans:
        assert end - start + 1 <= MAX_LINES, f"{file[1]}.lua: a function of {end - start + 1} lines"
    inside = {n for start, end in spans for n in range(start, end + 1)}
    main = [line for n, line in enumerate(text.splitlines(), 1) if n not in inside
            and line.strip()]
    assert len(main) <= MAX_LINES, f"{file[1]}.lua's main chunk is {len(main)} lines"


@pytest.mark.parametrize("spec", SCRIPTS, ids=ident)
def test_each_script_states_its_contract(spec: ScriptSpec) -> None:
    """What it reads (KEYS, and its arguments if it has any) and what it answers."""
    contract = header(lua.read_lua(spec.package, spec.name))
    assert contract.startswith(f"-- {spec.name}: ")
    assert "KEYS" in contract and "Result" in contract
    assert not spec.args or "args" in contract or "ARGV" in contract


@pytest.mark.parametrize("spec", [s for s in SCRIPTS if s.results], ids=ident)
def test_a_script_answers_each_of_its_results_and_no_bare_code(spec: ScriptSpec) -> None:
    """Every member of its result enum is answered somewhere; no ``return <number>``."""
    assert spec.results is not None
    enum, prefix = spec.results
    text = code(lua.read_lua(spec.package, spec.name))
    assert {prefix + member.name for member in enum} <= used_in(text)
    assert not re.search(r"\breturn\s+\{?\s*-?\d", text), f"{spec.name}.lua returns a number"


def test_the_prologue_names_keys_and_arguments_in_order() -> None:
    prologue = lua.prologue(scripts.COMPLETE)
    assert "local group, result_ttl, dead_letter_maxlen, inline_limit" in prologue
    streams, named = len(scripts.CompleteStream._fields), len(scripts.CompleteArgs._fields)
    assert f"local k, a = n * 4, {named} + n * {streams}" in prologue  # stream n's names
    assert ("stream, dead_letters, backlog, webhooks = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], "
            "KEYS[k + 4]") in prologue


def test_constants_are_written_in_as_literals() -> None:
    constants = lua.constants(scripts.COMPLETE)
    assert constants["NAMED_ARGS"] == str(len(scripts.CompleteArgs._fields))
    assert constants["EACH_KEYS"] == "4"
    assert constants["EACH_ARGS"] == str(len(scripts.CompleteStream._fields))
    assert constants["ITEM_SIZE"] == str(len(scripts.CompleteItem._fields))
    assert constants["BODY"] == str(scripts.CompleteItem._fields.index("body"))
    assert constants["PENDING"] == "'PENDING'"
    for spec in SCRIPTS:
        left = used_in(code(lua.source(spec))) & set(lua.constants(spec))
        assert not left, f"{spec.name}: constants left as names: {sorted(left)}"
    assert "ARGV[i + 3]" in lua.source(scripts.COMPLETE)  # ARGV[i + BODY]


def test_a_constant_must_be_a_plain_literal() -> None:
    spec = ScriptSpec("ferry.tasks", "heal", ("backlog",), constants=(("X", "a'b"),))
    with pytest.raises(ValueError, match="not a plain Lua string constant"):
        lua.constants(spec)


def test_results_are_generated_from_the_python_enums() -> None:
    admit, cancel = lua.constants(scripts.ADMIT), lua.constants(scripts.CANCEL)
    for member in scripts.AdmitVerdict:
        assert admit[f"VERDICT_{member.name}"] == str(int(member))
    for outcome in CancelOutcome:
        assert cancel[f"OUTCOME_{outcome.name}"] == str(int(outcome))


def test_a_fragment_is_prepended_once_and_only_where_declared() -> None:
    announce = "local function announce("
    assert lua.source(scripts.COMPLETE).count(announce) == 1
    assert announce not in lua.source(scripts.HEAL)


def test_the_package_ships_the_scripts() -> None:
    """The image installs the package (not the tree): its data must name every .lua file."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["ferry"]
    for path in FERRY.rglob("*.lua"):
        relative = path.relative_to(FERRY).as_posix()
        assert any(fnmatch.fnmatch(relative, glob) for glob in shipped), relative


# The stream commands that write an entry; the queue's room (``queue/lua``) writes every
# partition stream's. Other rooms' scripts write only their own streams, by these variables:
STREAM_WRITES = re.compile(r"redis\.p?call\('(XADD|XACK|XDEL|XCLAIM|XAUTOCLAIM|XTRIM)',\s*(\w+)")
OWN_STREAMS = {
    ("ferry.tasks", "common", "XADD", "webhooks"),  # a task's webhook, queued as it ends
    ("ferry.tasks", "complete", "XADD", "dead_letters"),
    ("ferry.batcher", "webhook_done", "XACK", "stream"),  # the webhook stream it read
    ("ferry.batcher", "webhook_done", "XDEL", "stream"),
    ("ferry.inference_log", "hand_off", "XADD", "stream"),  # a model's log stream
    ("ferry.inference_log", "hand_off", "XADD", "recent"),  # ... and its latest records
}


def stream_writes(package: str, name: str) -> set[tuple[str, str, str, str]]:
    return {(package, name, command, target)
            for command, target in STREAM_WRITES.findall(lua.read_lua(package, name))}


def test_only_the_queue_writes_a_partition_streams_entries() -> None:
    """Admission, completion and the rest change entries in their own step, through the
    queue's functions (``queue/lua/entries.lua``), never with a stream command of their own."""
    elsewhere = {write for package, name in FILES if package != "ferry.queue"
                 for write in stream_writes(package, name)}
    assert sorted(elsewhere - OWN_STREAMS) == []
    assert sorted(OWN_STREAMS - elsewhere) == []  # an exception no longer needed goes
    assert stream_writes("ferry.queue", "entries") >= {
        ("ferry.queue", "entries", "XADD", "stream"), ("ferry.queue", "entries", "XDEL", "stream")}
