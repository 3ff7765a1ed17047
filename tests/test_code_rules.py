"""Size rules for zoo's code: small modules with one job, small functions.

No module of ``zoo/`` is over 500 lines, and no function or method (nested ones included) of
``zoo/`` or the built-in plugins is over cyclomatic complexity 15, as radon counts it
(``radon cc -s -n C zoo plugins`` shows the same numbers). Each test lists every offender.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).parents[1]
MAX_LINES = 500
MAX_COMPLEXITY = 15


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


def test_the_rules_see_an_offender():
    nested = "def f(x):\n    def g(y):\n" + "".join(
        f"        if y == {i}:\n            return {i}\n" for i in range(MAX_COMPLEXITY)
    )
    found = [b for b in _functions(cc_visit(nested)) if b.complexity > MAX_COMPLEXITY]
    assert [b.name for b in found] == ["g"]
    assert len(_sources("zoo")) > 50
