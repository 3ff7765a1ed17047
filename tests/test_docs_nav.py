"""The guides in the order a newcomer reads them (the README's table once began
with plugin authoring, 625 lines, before training, generation or checkpoints): the README's
table of guides lists them in :data:`ORDER`, and every page of ``docs/`` opens with the same
nav line in that order, its own name in bold."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: The guides as a newcomer reads them: using a model (generate, train, adapters, chat,
#: serve, checkpoints, the Hub, tokenizers), then extending and studying zoo.
ORDER = [
    "generation",
    "training",
    "adapters",
    "peft",
    "chat",
    "serve",
    "checkpoints",
    "hub",
    "tokenizers",
    "plugins",
    "families",
    "layout",
    "reliability",
    "benchmarks",
]


def nav_line(current: str) -> str:
    """The nav line of ``docs/CURRENT.md``: the README, then every guide, ``current`` bold."""
    links = [f"**{name}**" if name == current else f"[{name}]({name}.md)" for name in ORDER]
    return "[README](../README.md) · guides: " + " · ".join(links)


def test_every_guide_is_in_the_order():
    assert sorted(ORDER) == sorted(p.stem for p in DOCS.glob("*.md"))


def test_every_page_opens_with_the_nav_line():
    wrong = {}
    for name in ORDER:
        lines = (DOCS / f"{name}.md").read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# "), f"docs/{name}.md: its title first"
        if lines[1:4] != ["", nav_line(name), ""]:
            wrong[name] = lines[2] if len(lines) > 2 else ""
    assert not wrong, f"expected line 3 as nav_line(name), got {wrong}"


def test_the_readme_lists_the_guides_in_the_order():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Guides", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| \[docs/(\w+)\.md\]", table, flags=re.MULTILINE)
    assert listed == ORDER
