"""The docs stay true and short: the README's size and links, and the configuration reference
against the code."""

from __future__ import annotations

import re
from pathlib import Path

from tests import config_reference

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# a relative Markdown link target, or a repository path named in code spans
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
COMMAND = re.compile(r"python -m tests\.bench|make (bench|demo)|[Cc]ommand|script not kept")
CODE_PATH = re.compile(r"`((?:dupalign|deploy|docs|demo|tests)/[\w./-]+)`")


def test_the_readme_is_short_and_narrow() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300)"
    wide = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 200]
    assert not wide, f"README.md lines over 200 characters (line, length): {wide}"


def test_every_path_the_readme_names_exists() -> None:
    text = README.read_text(encoding="utf-8")
    named = {m for m in LINK.findall(text) if "://" not in m} | set(CODE_PATH.findall(text))
    assert len(named) >= 10, f"the link pattern found too little: {sorted(named)}"
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_performance_pages_are_narrow_and_give_commands() -> None:
    pages = sorted((REPO / "docs" / "performance").glob("*.md"))
    assert len(pages) >= 5
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        wide = [n for n, line in enumerate(lines, 1) if len(line) > 200]
        assert not wide, f"{page.name}: lines over 200 characters: {wide}"
    for page in (p for p in pages if p.name != "README.md"):
        sections = page.read_text(encoding="utf-8").split("\n## ")[1:]
        bare = [s.splitlines()[0] for s in sections if not COMMAND.search(s)]
        assert not bare, f"{page.name}: sections without a command: {bare}"


def test_the_configuration_reference_matches_the_code() -> None:
    doc = config_reference.DOC.read_text(encoding="utf-8")
    rendered = config_reference.render(doc)
    keys_in_doc = set(config_reference.meanings(doc))
    keys_in_code = {row[0] for items in config_reference.rows().values() for row in items}
    assert keys_in_code - keys_in_doc == set(), "keys missing from docs/configuration.md"
    assert keys_in_doc - keys_in_code == set(), "docs/configuration.md names keys the code lacks"
    todo = [key for key, meaning in config_reference.meanings(doc).items()
            if meaning == config_reference.TODO]
    assert not todo, f"docs/configuration.md: keys without a meaning: {todo}"
    assert rendered == doc, ("docs/configuration.md differs from the code's types, defaults or "
                             "ranges: run python -m tests.config_reference --write")
