"""zoo's modules form layers, checked two ways.

Statically: the import graph of ``zoo`` (imports inside functions counted, ``TYPE_CHECKING``
blocks not) has no ring. At run time: a child process makes ``zoo`` a bare namespace (so the
package's ``__init__``, the public facade that imports everything, does not run), uses one
layer for real (builds, saves, loads) and lists what ended up in ``sys.modules``: a layer
never pulls in a layer above it, however deep in a function the import hides.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "zoo"


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The zoo modules ``name`` imports anywhere in its body (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    hidden = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{prefix}.{a.name}" for a in node.names]
            # `from pkg import sub` depends on the module pkg.sub; `from pkg import name` on pkg
            targets = [s for s in subs if s in modules]
            if len(targets) < len(subs):
                targets.append(prefix)
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _rings(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    rings: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            ring = []
            while True:
                w = stack.pop()
                ring.append(w)
                if w == v:
                    break
            if len(ring) > 1:
                rings.append(sorted(ring))

    for v in graph:
        if v not in index:
            visit(v)
    return rings


def test_no_module_ring():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["zoo"], "the import graph is empty: the test reads nothing"
    assert _rings(graph) == []


def test_the_ring_finder_finds_a_ring():
    assert _rings({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


BARE = textwrap.dedent(
    """
    import importlib.util, json, os, sys
    root = sys.argv[1]
    spec = importlib.util.spec_from_file_location(
        "zoo", os.path.join(root, "__init__.py"), submodule_search_locations=[root]
    )
    sys.modules["zoo"] = importlib.util.module_from_spec(spec)  # its __init__ never runs
    """
)

USES = {
    # the model code: builds and runs a model from a config and the built-in parts
    "zoo.nn": """
        import torch
        from zoo.config import DecoderConfig
        from zoo.nn import DecoderLM
        config = DecoderConfig(vocab_size=50, context_length=16, d_model=32, n_heads=2,
                               d_ff=64, n_layers=1, positions="rotary", norm="rmsnorm",
                               ffn="swiglu")
        DecoderLM(config)(torch.tensor([[1, 2, 3]]))
    """,
    # checkpoints: save and load a model (the registry resolves its architecture)
    "zoo.checkpoint": """
        import tempfile, torch
        from zoo.checkpoint.api import load_local, save
        from zoo.plugin.registry import get_registry
        arch, _, config = get_registry().resolve("gpt2-124m", n_layers=1, d_model=32,
                                                 n_heads=2, d_ff=64, vocab_size=300)
        model = get_registry().model_factory(arch)(config)
        with tempfile.TemporaryDirectory() as folder:
            save(model, folder)
            load_local(folder, tokenizer=False)
    """,
    # the registry: lists and resolves without building anything
    "zoo.plugin.registry": """
        from zoo.plugin.registry import get_registry
        registry = get_registry()
        registry.resolve("gpt2-124m")
        registry.models()
    """,
}

#: What each layer must never load: the layers above it.
ABOVE = {
    "zoo.nn": (
        "zoo.plugin.registry",
        "zoo.plugin.host",
        "zoo.checkpoint",
        "zoo.hub",
        "zoo.api",
        "zoo.loading",
        "zoo.cli",
        "zoo.train",
        "zoo.generation",
    ),
    "zoo.checkpoint": ("zoo.hub", "zoo.api", "zoo.loading", "zoo.cli", "zoo.train"),
    "zoo.plugin.registry": (
        "torch",
        "zoo.nn",
        "zoo.checkpoint",
        "zoo.hub",
        "zoo.api",
        "zoo.loading",
    ),
}


@pytest.mark.parametrize("layer", sorted(USES))
def test_a_layer_in_use_loads_nothing_above_it(layer):
    code = BARE + textwrap.dedent(USES[layer]) + "print(json.dumps(sorted(m for m in sys.modules)))"
    run = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert any(m.startswith(layer) for m in loaded), "the layer was not used"
    above = sorted(m for m in loaded if m.startswith(ABOVE[layer]))
    assert above == [], f"{layer} pulled in {above}"
