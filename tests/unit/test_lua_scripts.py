"""The task store's Lua scripts, read without Redis: every name a script uses is declared (by the
Python side's NamedTuples, the generated constants, or the script itself), every declared name is
used, and key names come only from ``keys.py``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from ferry.tasks import scripts
from ferry.tasks.base import CancelOutcome
from ferry.tasks.scripts import SCRIPTS, ScriptSpec

LUA_KEYWORDS = frozenset({"and", "break", "do", "else", "elseif", "end", "false", "for",
                          "function", "if", "in", "local", "nil", "not", "or", "repeat",
                          "return", "then", "true", "until", "while"})
LUA_GLOBALS = frozenset({"redis", "string", "table", "math", "tonumber", "tostring", "type",
                         "ipairs", "pairs", "unpack", "KEYS", "ARGV"})
MAX_LINES = 40
IDENTIFIER = re.compile(r"(?<![.:\w])[A-Za-z_]\w*")
STRING_OR_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"",
                               re.DOTALL)
BY_NAME = {spec.name: spec for spec in SCRIPTS}


def code(lua: str) -> str:
    """The Lua without comments, and with every string literal emptied (lines kept)."""
    return STRING_OR_COMMENT.sub(lambda m: "''" if m.group()[0] in "'\"" else "", lua)


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


@pytest.mark.parametrize("spec", SCRIPTS, ids=lambda s: s.name)
def test_every_name_a_script_uses_is_declared(spec: ScriptSpec) -> None:
    whole = code(scripts.source(spec))
    undeclared = used_in(whole) - declared_in(whole) - LUA_GLOBALS
    assert not undeclared, f"{spec.name}.lua uses undeclared names: {sorted(undeclared)}"


@pytest.mark.parametrize("spec", SCRIPTS, ids=lambda s: s.name)
def test_every_declared_key_and_argument_is_used(spec: ScriptSpec) -> None:
    used = used_in(code(scripts.read_lua(spec.name)))
    offsets = {name.upper() for name in spec.item}
    unused = {*spec.keys, *spec.args, *offsets} - used
    assert not unused, f"{spec.name}.lua declares but never uses: {sorted(unused)}"
    assert len({*spec.keys, *spec.args, *offsets}) == len(spec.keys) + len(spec.args) + len(
        offsets), "a name is declared twice"


@pytest.mark.parametrize("spec", SCRIPTS, ids=lambda s: s.name)
def test_scripts_index_keys_and_argv_only_through_generated_names(spec: ScriptSpec) -> None:
    lua = code(scripts.read_lua(spec.name))
    assert not re.search(r"\b(?:KEYS|ARGV)\[\s*\d", lua)


@pytest.mark.parametrize("name", ["common", *BY_NAME])
def test_scripts_build_no_key_names_of_their_own(name: str) -> None:
    lua = scripts.read_lua(name)
    for literal in ("'task:", "'webhooks'", "'followers:", "'cache:", "ferry:", "{p"):
        assert literal not in lua, f"{name}.lua spells a key name: {literal}"


def blocks(lua: str) -> list[tuple[int, int]]:
    """(first line, last line) of each function, by its ``function``...``end`` nesting."""
    spans: list[tuple[int, int]] = []
    stack: list[tuple[str, int]] = []
    for line_no, line in enumerate(lua.splitlines(), 1):
        for word in re.findall(r"\b(function|if|do|end)\b", line):
            if word == "end":
                kind, start = stack.pop()
                if kind == "function":
                    spans.append((start, line_no))
            else:
                stack.append((word, line_no))
    assert not stack, "unbalanced blocks"
    return spans


@pytest.mark.parametrize("name", ["common", *BY_NAME])
def test_no_function_or_main_chunk_is_over_forty_lines(name: str) -> None:
    lua = code(scripts.read_lua(name))
    spans = blocks(lua)
    for start, end in spans:
        assert end - start + 1 <= MAX_LINES, f"{name}.lua: a function of {end - start + 1} lines"
    inside = {n for start, end in spans for n in range(start, end + 1)}
    main = [line for n, line in enumerate(lua.splitlines(), 1) if n not in inside
            and line.strip()]
    assert len(main) <= MAX_LINES, f"{name}.lua's main chunk is {len(main)} lines"


@pytest.mark.parametrize("spec", SCRIPTS, ids=lambda s: s.name)
def test_each_script_states_its_contract(spec: ScriptSpec) -> None:
    header = scripts.read_lua(spec.name).split("\n\n")[0]
    assert header.startswith(f"-- {spec.name}: ")
    assert "KEYS" in header and "Result" in header


def test_the_prologue_names_keys_and_arguments_in_order() -> None:
    prologue = scripts.prologue(scripts.COMPLETE)
    assert "local stream, dead_letters, backlog, webhooks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]" \
        in prologue
    assert "local group, result_ttl, channel," in prologue


def test_constants_are_written_in_as_literals() -> None:
    constants = scripts.constants(scripts.COMPLETE)
    assert constants["FIRST_TASK_KEY"] == "5"
    assert constants["FIRST_ITEM"] == str(len(scripts.CompleteArgs._fields) + 1)
    assert constants["ITEM_SIZE"] == str(len(scripts.CompleteItem._fields))
    assert constants["BODY"] == str(scripts.CompleteItem._fields.index("body"))
    assert constants["PENDING"] == "'PENDING'"
    for spec in SCRIPTS:
        left = used_in(code(scripts.source(spec))) & set(scripts.constants(spec))
        assert not left, f"{spec.name}: constants left as names: {sorted(left)}"
    assert "ARGV[i + 3]" in scripts.source(scripts.COMPLETE)  # ARGV[i + BODY]


def test_results_are_generated_from_the_python_enums() -> None:
    admit, cancel = scripts.constants(scripts.ADMIT), scripts.constants(scripts.CANCEL)
    for member in scripts.AdmitVerdict:
        assert admit[f"VERDICT_{member.name}"] == str(int(member))
    for outcome in CancelOutcome:
        assert cancel[f"OUTCOME_{outcome.name}"] == str(int(outcome))


def test_a_fragment_is_prepended_once_and_only_where_declared() -> None:
    announce = "local function announce("
    assert scripts.source(scripts.COMPLETE).count(announce) == 1
    assert announce not in scripts.source(scripts.HEAL)


def test_the_package_ships_the_scripts() -> None:
    """The image installs the package (not the tree): its data must name the .lua files."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["ferry"]
    lua = Path(scripts.__file__).parent / "lua"
    assert "tasks/lua/*.lua" in shipped
    assert {p.stem for p in lua.glob("*.lua")} == {"common", "unqueue", *BY_NAME}
