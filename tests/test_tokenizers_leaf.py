"""``zoo.tokenizers`` is a leaf: it stands on a few modules that import nothing of zoo's above
them (``zoo.errors``, ``zoo._lazy``, ``zoo.options``, ``zoo.jsonfile``), never on the
registry, the plugin contract, the Hub client or the checkpoint code. A tokenizer stored by
name is made by the caller (``load_tokenizer(..., by_name=...)``) and Hub files are fetched
by :mod:`zoo.hub.tokenizer_files`.

Checked statically (every import of every module, inside functions too, ``TYPE_CHECKING``
blocks not) and at run time (a child process imports the package with ``zoo``'s own
``__init__``, the facade, kept from running)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

ZOO = Path(__file__).parents[1] / "zoo"

#: What zoo.tokenizers may import outside itself: modules that stand on nothing else of zoo's.
LEAVES = {"zoo.errors", "zoo._lazy", "zoo.options", "zoo.jsonfile"}
PACKAGE = "zoo.tokenizers"


def _zoo_imports(source: str, package: str) -> set[str]:
    """The ``zoo.*`` names ``source`` (a module of ``package``) imports anywhere, not under
    ``TYPE_CHECKING``."""
    tree = ast.parse(source)
    hidden = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            prefix = ".".join((base if node.level else []) + ([node.module] if node.module else []))
            found.update(f"{prefix}.{a.name}" for a in node.names)
    return {name for name in found if name == "zoo" or name.startswith("zoo.")}


def _outside(names: set[str], inside: str) -> set[str]:
    """``names`` that are neither in the package ``inside`` nor (in) an allowed leaf."""
    allowed = (inside, *LEAVES)
    return {n for n in names if not any(n == a or n.startswith(a + ".") for a in allowed)}


def test_tokenizers_import_only_leaves():
    modules = sorted((ZOO / "tokenizers").glob("*.py"))
    assert len(modules) > 5, "the test reads nothing"
    reached = {
        path.name: sorted(_outside(_zoo_imports(path.read_text(), PACKAGE), PACKAGE))
        for path in modules
    }
    assert {name: up for name, up in reached.items() if up} == {}


def test_the_leaves_are_leaves():
    for leaf in sorted(LEAVES):
        path = ZOO / (leaf.removeprefix("zoo.").replace(".", "/") + ".py")
        assert _outside(_zoo_imports(path.read_text(), "zoo"), "zoo.errors") == set(), leaf


def test_the_checker_sees_imports_in_functions_but_not_type_checking():
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from .errors import TokenizerError
        if TYPE_CHECKING:
            from ..hub import transfer
        def f():
            from ..plugin.current import get_registry
        """
    )
    found = _zoo_imports(source, "zoo.tokenizers")
    assert found == {"zoo.tokenizers.errors.TokenizerError", "zoo.plugin.current.get_registry"}
    assert _outside(found, "zoo.tokenizers") == {"zoo.plugin.current.get_registry"}


BARE = textwrap.dedent(
    """
    import importlib, importlib.util, json, os, sys
    root = sys.argv[1]
    spec = importlib.util.spec_from_file_location(
        "zoo", os.path.join(root, "__init__.py"), submodule_search_locations=[root]
    )
    sys.modules["zoo"] = importlib.util.module_from_spec(spec)  # its __init__ never runs
    import zoo.tokenizers.errors
    import zoo.tokenizers
    from zoo.tokenizers import Tokenizer, load_tokenizer, save_tokenizer
    print(json.dumps(sorted(m for m in sys.modules if m.startswith("zoo"))))
    """
)


def test_importing_the_tokenizers_loads_nothing_above_them():
    run = subprocess.run(
        [sys.executable, "-c", BARE, str(ZOO)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = set(json.loads(run.stdout.strip().splitlines()[-1]))
    assert _outside(loaded - {"zoo"}, PACKAGE) == set()
