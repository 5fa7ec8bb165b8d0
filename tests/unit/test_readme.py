"""The README and docs/ stay true: the front door's two commands, the configuration table is the
code's, and every relative link leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ferry.settings import reference_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
FRONT_DOOR_LINES = 160  # reference material belongs in docs/, not in the README (150 until
# 2026-11-28: the first request gained its Python form)


def test_readme_starts_with_the_two_commands() -> None:
    head = README.read_text().splitlines()[:6]
    assert any(line.startswith("make up") for line in head)
    assert any(line.startswith("make test") for line in head)


def test_readme_stays_a_front_door() -> None:
    assert len(README.read_text().splitlines()) <= FRONT_DOOR_LINES


def test_configuration_table_matches_the_settings() -> None:
    text = (DOCS / "configuration.md").read_text()
    assert reference_table() in text, "docs/configuration.md is stale: paste `ferry settings`"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = [target for target, _ in LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, f"{page.name} links to missing files: {broken}"
