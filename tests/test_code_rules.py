"""Size rules for zoo's code: small modules with one job, small functions.

No module of ``zoo/`` is over 500 lines, and no function or method (nested ones included) of
``zoo/`` or the built-in plugins is over cyclomatic complexity 15, as radon counts it
(``radon cc -s -n C zoo plugins`` shows the same numbers). Each test lists every offender.

No file of the source, tests, benchmarks or docs names a tracker's issue by its number: a
reader has no tracker, so each sentence says what it means on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).parents[1]
MAX_LINES = 500
MAX_COMPLEXITY = 15
#: Where a sentence may not point at a tracker's issue by number.
PROSE = ("zoo", "plugins", "tests", "benchmarks", "docs", "README.md")
#: "issue", "issues", "Issue #" followed by a number; built in two parts so that this file
#: does not match it.
ISSUE_NUMBER = re.compile(r"\bissues?" + r"[\s#-]*\d+", re.IGNORECASE)


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _functions(blocks: list) -> Iterator:
    """radon's function blocks, closures included (it lists methods beside their class)."""
    for block in blocks:
        if not hasattr(block, "methods"):  # a class's complexity is its methods'
            yield block
            yield from _functions(block.closures)


def test_no_module_is_over_500_lines():
    sizes = {p: len(p.read_text().splitlines()) for p in _sources("zoo")}
    over = [f"{p.relative_to(ROOT)}: {n} lines" for p, n in sorted(sizes.items()) if n > MAX_LINES]
    assert not over, f"modules over {MAX_LINES} lines:\n" + "\n".join(over)


def test_no_function_is_over_complexity_15():
    over = [
        f"{path.relative_to(ROOT)}:{block.lineno} {block.fullname}: {block.complexity}"
        for path in _sources("zoo", "plugins")
        for block in _functions(cc_visit(path.read_text()))
        if block.complexity > MAX_COMPLEXITY
    ]
    assert not over, f"functions over complexity {MAX_COMPLEXITY}:\n" + "\n".join(over)


def _texts(*names: str) -> Iterator[tuple[str, str]]:
    """(path from the root, text) of every text file under ``names`` (folders or files):
    binaries (undecodable as UTF-8, or holding a NUL) and ``__pycache__`` are left out."""
    for name in names:
        top = ROOT / name
        for path in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                continue
            if "\0" not in text:
                yield path.relative_to(ROOT).as_posix(), text


def _issue_numbers(text: str) -> list[str]:
    """Each place ``text`` names an issue by number, as ``line N: the match``."""
    return [
        f"line {text.count(chr(10), 0, m.start()) + 1}: {' '.join(m[0].split())}"
        for m in ISSUE_NUMBER.finditer(text)
    ]


def test_no_file_names_an_issue_by_number():
    found = [f"{path} {where}" for path, text in _texts(*PROSE) for where in _issue_numbers(text)]
    assert not found, (
        "these name a tracker's issue by number, which no reader has: say what the sentence "
        "means on its own (what was wrong, what holds now) and drop the number:\n"
        + "\n".join(found)
    )


def test_the_issue_check_sees_every_spelling():
    spellings = ["(is" + "sue 41: x)", "Is" + "sues 19 and 28", "is" + "sue #7", "is" + "sue\n12"]
    assert [len(_issue_numbers(s)) for s in spellings] == [1, 1, 1, 1]
    assert _issue_numbers("the is" + "sue's goal; tis" + "sue 3") == []
    assert sum(1 for _ in _texts(*PROSE)) > 300


def test_the_rules_see_an_offender():
    nested = "def f(x):\n    def g(y):\n" + "".join(
        f"        if y == {i}:\n            return {i}\n" for i in range(MAX_COMPLEXITY)
    )
    found = [b for b in _functions(cc_visit(nested)) if b.complexity > MAX_COMPLEXITY]
    assert [b.name for b in found] == ["g"]
    assert len(_sources("zoo")) > 50
