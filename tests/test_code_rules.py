"""Size rules for zoo's code: small modules with one job, small functions.

No module of ``zoo/`` is over 500 lines, and no function or method (nested ones included) of
``zoo/`` or the built-in plugins is over cyclomatic complexity 15, as radon counts it
(``radon cc -s -n C zoo plugins`` shows the same numbers). Each test lists every offender.

No file of the source, tests, benchmarks or docs names a tracker's issue by its number: a
reader has no tracker, so each sentence says what it means on its own.

No comment or docstring of ``zoo/`` or the built-in plugins holds a measured time or speed
ratio: they go stale as PyTorch, zoo and machines change. The source says the reason in words
and docs/benchmarks.md ("Figures behind design choices") keeps the figures, as a record.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
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


#: A measured time or speed: a number (or a range such as ``5-7``) followed by ms, us, µs, ns,
#: tok/s or tokens/s, or a ratio followed by faster, slower, as fast, as long...
#: Units are matched as whole words in their lower case, so ``users``, ``0x1f``, ``2 x (N, k)``
#: (a shape) and ``4x the weight`` (a size) are not. Seconds and bytes (s, MB, GiB) are not
#: matched at all: limits and defaults are written in them (timeouts, caps, histogram
#: bounds), and no pattern tells those from a measured peak; each such figure was read by
#: hand when this check was added.
TIMING = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)?(?:\s?-\s?\d+(?:\.\d+)?)?\s?(?:ms|us|µs|ns|tok/s|tokens/s)(?![\w/])"
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?i:x|times|%)\s+"
    r"(?i:faster|slower|as fast|as slow|as long|longer|shorter|quicker)\b"
)
#: C comments, block and line.
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def _prose(text: str, suffix: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and docstring of a Python or C source: a docstring is any
    string standing as a statement of its own (a module's, class's or function's, or an
    attribute's after its assignment); strings in code (messages, f-strings) are left out."""
    if suffix in (".c", ".h"):
        for m in C_COMMENT.finditer(text):
            yield text.count("\n", 0, m.start()) + 1, m[0]
        return
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        value = node.value if isinstance(node, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            yield node.lineno, value.value


def _timings(text: str, suffix: str = ".py") -> list[str]:
    """Each measured timing in the comments and docstrings of ``text``, as ``line N: match``."""
    return [
        f"line {line + prose.count(chr(10), 0, m.start())}: {' '.join(m[0].split())}"
        for line, prose in sorted(_prose(text, suffix))
        for m in TIMING.finditer(prose)
    ]


def _code_files() -> list[str]:
    """The Python and C sources of ``zoo/`` and the built-in plugins, from the root."""
    return [path for path, _ in _texts("zoo", "plugins") if path.endswith((".py", ".c", ".h"))]


def test_no_comment_or_docstring_holds_a_measured_timing():
    found = [
        f"{path} {where}"
        for path in _code_files()
        for where in _timings((ROOT / path).read_text(encoding="utf-8"), Path(path).suffix)
    ]
    assert not found, (
        "these comments or docstrings hold a measured time or speed ratio, which goes stale: "
        "keep the reason in words (e.g. 'oneDNN's call costs more than a small matrix earns "
        "back') and move the figure, with its machine and command, to docs/benchmarks.md, "
        "'Figures behind design choices':\n" + "\n".join(found)
    )


def test_the_timing_check_sees_measurements_and_spares_limits():
    measured = [
        "took 3.0 ms",
        "~40 us more",
        "5-7 ms of 30-36",
        "(32.2 tok/s)",
        "12 µs",
        "9us",
        "about 1.5x faster",
        "4x slower at 128 rows",
        "about 1.5x as fast",
        "about 1.8x\n    as long",
        "2 threads are 20% faster",
        "5-20 times faster",
        "3X Faster",
    ]
    assert [len(TIMING.findall(s)) for s in measured] == [1] * len(measured)
    spared = [
        "weights of at least 1 MiB",
        "a 100 MB header",
        "default 30 seconds",
        "from 0.001 to 60",
        "``3 h 02 min 07 s``",
        "users",
        "0x1f",
        "2 x (N, k)",
        "4x the weight",
        "transformers 4.x",
        "5GB",
        "2 threads",
        "status 413",
        "90% of the memory",
        "2**24 rows",
        "10 msgs",
    ]
    assert [s for s in spared if TIMING.search(s)] == []


def test_the_timing_check_reads_comments_and_docstrings_only():
    source = (
        '"""Module: took 1 ms."""\n'
        "X = 1  # took 2 ms\n"
        '"""X: took 3 ms."""\n'
        "def f(s):\n"
        '    """f: took 4 ms."""\n'
        '    return f"{s:g} ms" + "5 ms"\n'
    )
    assert _timings(source) == ["line 1: 1 ms", "line 2: 2 ms", "line 3: 3 ms", "line 5: 4 ms"]
    c_source = 'int x; /* one\n * took 6 us */\n// 7 ms\nchar *s = "8 ms";\n'
    assert _timings(c_source, ".c") == ["line 2: 6 us", "line 3: 7 ms"]
    files = _code_files()
    assert len(files) > 100 and any(f.endswith(".c") for f in files)
