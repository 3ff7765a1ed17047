"""Reading the README and the guides in ``docs/``: their fenced code blocks, the commands of
their ``sh`` blocks, their links and their headings' anchors (the tests that run and check
the documents share this one reader)."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: Comments that mark a command or a line of Python the tests do not run, and why ("tested
#: in tests/test_x.py": a slow line, such as a first compilation, that test runs).
NOT_HERE = ("needs the Hub", "several machines", "needs a GPU", "tested in tests/")

#: What a ``needs the Hub`` comment adds when a local Hub (``python -m zoo.localhub``, see
#: docs/hub.md) does as well: the tests run such a line, against a local Hub they start.
LOCAL_HUB = "or a local one"


def runs_here(comment: str) -> bool:
    """Whether the tests run a command or line of Python with this comment: unmarked, or
    marked as needing the Hub where a local one does (:data:`LOCAL_HUB`)."""
    return LOCAL_HUB in comment or not any(mark in comment for mark in NOT_HERE)


#: The programs whose commands an ``sh`` block's test runs (install steps are `.ci/run`'s).
PROGRAMS = ("zoo", "torchrun", "python -m zoo")

_FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", flags=re.M | re.S)


def documents() -> list[Path]:
    """The README, then every guide in ``docs/`` by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: the document, its first line's number, its language and text
    (dedented when the block sits inside a list item)."""

    path: Path
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        """``docs/x.md:12``, for messages and tracebacks."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path, language: str | None = None) -> list[Block]:
    """The fenced blocks of ``path`` in order, only those of ``language`` if given."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        if language is None or match.group(2) == language:
            line = text.count("\n", 0, match.start()) + 2
            found.append(Block(path, line, match.group(2), textwrap.dedent(match.group(3))))
    return found


def commands(block: Block) -> list[tuple[str, str]]:
    """``(command, comment)`` for each command line of an ``sh`` block; a ``&&`` chain is
    split and only the commands of :data:`PROGRAMS` are kept."""
    found: list[tuple[str, str]] = []
    for line in re.sub(r"\\\n\s*", " ", block.text).splitlines():
        command, _, comment = line.partition(" # ")
        if line.lstrip().startswith("#"):
            continue
        for part in command.split("&&"):
            part = part.strip()
            if part.startswith(PROGRAMS):
                found.append((part, comment.strip()))
    return found


def all_commands(paths: list[Path] | None = None) -> list[tuple[str, str]]:
    """Every ``sh`` command of ``paths`` (default: every document), in order."""
    return [c for p in paths or documents() for b in blocks(p, "sh") for c in commands(b)]


def python_to_run(block: Block) -> str:
    """A ``python`` block as the tests run it: a line whose comment holds a :data:`NOT_HERE`
    mark becomes ``pass`` (same indentation), so the rest of the block still runs; one that
    a local Hub runs (:data:`LOCAL_HUB`) stays."""
    lines = []
    for line in block.text.splitlines():
        code, hash_, comment = line.partition("#")
        if hash_ and code.strip() and not runs_here(comment):
            indent = line[: len(line) - len(line.lstrip())]
            line = f"{indent}pass  # not run here: {comment.strip()}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def guide_text() -> str:
    """The README and every guide, one after the other."""
    return "\n".join(p.read_text(encoding="utf-8") for p in documents())


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of the headings of ``path`` (outside code blocks)."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return {anchor(h) for h in re.findall(r"^#{1,6} +(.+?)\s*$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    """The targets of the Markdown links of ``path`` (outside code blocks)."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return re.findall(r"\]\(([^)\s]+)\)", text)
