"""The README's instructions stay true: its configuration table is the code's."""

from __future__ import annotations

from pathlib import Path

from ferry.settings import reference_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_starts_with_the_two_commands() -> None:
    head = README.read_text().splitlines()[:6]
    assert any(line.startswith("make up") for line in head)
    assert any(line.startswith("make test") for line in head)


def test_readme_configuration_table_matches_the_settings() -> None:
    assert reference_table() in README.read_text(), "README is stale: paste `ferry settings`"
