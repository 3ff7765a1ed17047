"""zoo's modules form layers, checked two ways.

Statically: the import graph of ``zoo`` and the built-in plugins (``plugins/``, installed as
``zoo_plugins``) has no ring. Imports inside functions count, ``TYPE_CHECKING`` blocks do
not, and so do the package ``__init__``s Python runs on the way: importing ``a.b.c`` runs
``a/__init__`` and ``a/b/__init__`` first, so a module that imports ``a.b.c`` depends on
``a`` and ``a.b`` as well (all but the packages it sits in itself, which are already running
when its own body runs).

Every import goes down the map of layers in ``docs/layout.md`` (its table is read here).

At run time: a child process makes ``zoo`` a bare namespace (so the package's ``__init__``
does not run), uses one layer for real (builds, saves, loads, encodes, generates, serves,
trains) and lists what ended up in ``sys.modules``: a layer never pulls in a layer above it,
however deep in a function the import hides.

``python tests/test_layering.py`` prints the rings, one per line.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "zoo"
#: Where each top-level package's source lives (``plugins/`` is installed as ``zoo_plugins``).
PACKAGES = {"zoo": ROOT, "zoo_plugins": ROOT.parent / "plugins"}


def _modules() -> dict[str, Path]:
    """Every module of zoo and the built-in plugins, by dotted name."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _parents(name: str) -> list[str]:
    """The packages Python imports before ``name``: ``a.b.c`` -> ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _lazy_names(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> the module each name it exports on first use comes from (zoo._lazy), which
    ``from package import name`` imports: the packages are imported to read them."""
    for package in sorted(modules):
        if modules[package].name == "__init__.py" and package.split(".")[0] == "zoo":
            importlib.import_module(package)
    return {
        package: {name: ref.partition(":")[0] for name, ref in refs.items()}
        for package, refs in getattr(importlib.import_module("zoo._lazy"), "LAZY_NAMES", {}).items()
    }


def _imports(
    name: str, path: Path, modules: dict[str, Path], lazy: dict[str, dict[str, str]] | None = None
) -> set[str]:
    """The modules ``name`` imports anywhere in its body (not under TYPE_CHECKING), with the
    package ``__init__``s each import runs on the way (and, for a name a package exports
    lazily, the module it comes from)."""
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
            exported = (lazy or {}).get(prefix, {})
            targets += [exported[a.name] for a in node.names if a.name in exported]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                # run on the way, unless ``name`` sits in them (then they already are running)
                found.update(p for p in _parents(target) if p != name and p not in _parents(name))
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
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return rings


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    lazy = _lazy_names(modules)
    return {name: _imports(name, path, modules, lazy) for name, path in modules.items()}


def _describe(ring: list[str], graph: dict[str, set[str]]) -> str:
    """One ring as the modules in it and, for each, what it imports inside the ring."""
    edges = "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(ring)))}" for m in ring)
    return f"{len(ring)} modules: {edges}"


def test_no_module_ring():
    graph = _graph()
    assert graph["zoo.api"], "the import graph is empty: the test reads nothing"
    assert any(m.startswith("zoo_plugins.") for m in graph), "the plugins were not read"
    rings = _rings(graph)
    assert rings == [], "import rings:\n" + "\n".join(_describe(r, graph) for r in rings)


def test_the_ring_finder_finds_a_ring():
    assert _rings({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_import_runs_the_packages_on_the_way(tmp_path):
    # x.y imports a.b.c: it depends on a.b (and a), whose __init__ runs first; a.b.c itself
    # does not depend on a.b (a.b is already running when a.b.c's body runs)
    files = {
        "a/__init__.py": "",
        "a/b/__init__.py": "from .c import f\n",
        "a/b/c.py": "from ..d import g\n",
        "a/d.py": "def g(): from x import y\n",
        "x/__init__.py": "",
        "x/y.py": "def h(): import a.b.c\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = {"a": "a/__init__.py", "a.b": "a/b/__init__.py", "a.b.c": "a/b/c.py"}
    modules |= {"a.d": "a/d.py", "x": "x/__init__.py", "x.y": "x/y.py"}
    paths = {name: tmp_path / file for name, file in modules.items()}
    graph = {name: _imports(name, path, paths) for name, path in paths.items()}
    assert graph["x.y"] == {"a", "a.b", "a.b.c"}
    assert graph["a.b.c"] == {"a.d"}
    assert graph["a.d"] == {"x", "x.y"}
    assert _rings(graph) == [["a.b", "a.b.c", "a.d", "x.y"]]
    # a name package a exports lazily (zoo._lazy) is an import of the module it comes from
    (tmp_path / "x/z.py").write_text("from a import h\n")
    assert _imports("x.z", tmp_path / "x/z.py", paths, {"a": {"h": "a.d"}}) == {"a", "a.d"}


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

#: A tiny decoder with the byte tokenizer, built from the model code alone.
TINY = textwrap.dedent(
    """
    import torch
    from zoo.config import DecoderConfig
    from zoo.nn import DecoderLM
    from zoo.tokenizers.byte import ByteTokenizer
    tok = ByteTokenizer()
    config = DecoderConfig(vocab_size=257, context_length=32, d_model=32, n_heads=2,
                           d_ff=64, n_layers=1, positions="rotary", norm="rmsnorm",
                           ffn="swiglu")
    model = DecoderLM(config).eval()
    """
)

USES = {
    # the kernels: loaded, and one row through the float32 product and the norm
    "zoo.kernels": """
        import torch
        from zoo.kernels import native, native_int8, threads
        native.available()
        x, w = torch.randn(1, 16), torch.randn(8, 16)
        native.linear(x, w)
        native.rms_norm(x, torch.ones(16), 1e-5)
    """,
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
    # the decoding runtime: a session over a KV cache, a slot batch, the prefix cache
    "zoo.runtime": TINY
    + textwrap.dedent(
        """
        from zoo.runtime import start_decoding
        from zoo.runtime.prefix_cache import prefix_cache_for
        from zoo.runtime.slot_step import slot_batch
        with torch.no_grad():
            session = start_decoding(model, torch.tensor([[1, 2, 3]]), None, 2)
            session.step(session.prefill().argmax(-1))
            start_decoding(model, torch.tensor([[1]]), None, 2).prefill()  # the one-call step
            slot_batch(model, 2, 16)
            prefix_cache_for(model, 1 << 20)
    """
    ),
    # tokenizers: every public name, the byte tokenizer, a trained one saved and loaded
    "zoo.tokenizers": """
        import tempfile
        import zoo.tokenizers as tokenizers
        from zoo.tokenizers.byte import ByteTokenizer
        for name in tokenizers.__all__:
            getattr(tokenizers, name)
        tok = ByteTokenizer()
        assert tok.decode(tok.encode("héllo")) == "héllo"
        trained = tokenizers.SubwordBPE.train(["a tiny corpus, a tiny corpus"] * 20, 300)
        with tempfile.TemporaryDirectory() as folder:
            spec = tokenizers.save_tokenizer(trained, folder)
            again = tokenizers.load_tokenizer(spec, folder)
        assert again.decode(again.encode("a tiny corpus")) == "a tiny corpus"
        source = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        template = tokenizers.ChatTemplate({"default": source})
        assert template.render([{"role": "user", "content": "hi"}]) == "hi"
    """,
    # generation: every public name; text, a batch, a stream and ids from a tiny model
    "zoo.generation": TINY
    + textwrap.dedent(
        """
        import zoo.generation as generation
        for name in generation.__all__:
            getattr(generation, name)
        options = dict(tokenizer=tok, max_new_tokens=3, temperature=0.8, seed=0)
        generation.generate(model, "hi", **options)
        generation.generate(model, ["hi", "hello"], **options)
        "".join(generation.generate(model, "hi", stream=True, stop="x", **options))
        generation.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2)
    """
    ),
    # serving: the HTTP application over a running engine answers a completion (ASGI calls)
    "zoo.serve": TINY
    + textwrap.dedent(
        """
        import asyncio
        from zoo.serve import Engine, create_app
        engine = Engine(model, max_batch=2, max_queue=2)
        engine.start()
        app = create_app(engine, tok, model_id="tiny")

        async def call(path, body):
            messages = [{"type": "http.request", "body": json.dumps(body).encode()}]
            sent = []

            async def receive():  # the body, then a client that stays
                if messages:
                    return messages.pop(0)
                await asyncio.Event().wait()

            async def send(message):
                sent.append(message)

            headers = [(b"content-type", b"application/json")]
            scope = {"type": "http", "method": "POST", "path": path, "headers": headers,
                     "query_string": b"", "http_version": "1.1", "scheme": "http",
                     "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "root_path": ""}
            await app(scope, receive, send)
            return sent[0]["status"]

        body = {"model": "tiny", "prompt": "hi", "max_tokens": 3}
        assert asyncio.run(call("/v1/completions", body)) == 200
        engine.stop()
    """
    ),
    # training: a tiny run on its named model's tokenizer, then the same run again, which
    # resumes from its checkpoint (the saved model loaded back)
    "zoo.train": """
        import tempfile, os
        from zoo.plugin.current import get_registry
        from zoo.train import TrainConfig, train
        arch, spec, config = get_registry().resolve("gpt2-124m", n_layers=1, d_model=32,
                                                    n_heads=2, d_ff=64, context_length=16)
        with tempfile.TemporaryDirectory() as folder:
            data = os.path.join(folder, "data.txt")
            with open(data, "w") as f:
                f.write("a tiny corpus to train on. " * 200)
            for _ in range(2):
                model = get_registry().model_factory(arch)(config)
                model.name = spec.name  # no tokenizer given: the named model's is used
                options = dict(steps=2, batch_size=2, warmup=1, eval_every=2,
                               eval_batches=1, checkpoint_every=2)
                train(model, data, os.path.join(folder, "run"),
                      config=TrainConfig(**options), device="cpu", log=None)
    """,
    # checkpoints: save and load a model (the registry resolves its architecture)
    "zoo.checkpoint": """
        import tempfile, torch
        from zoo.checkpoint import load_local, save
        from zoo.plugin.current import get_registry
        arch, _, config = get_registry().resolve("gpt2-124m", n_layers=1, d_model=32,
                                                 n_heads=2, d_ff=64, vocab_size=300)
        model = get_registry().model_factory(arch)(config)
        with tempfile.TemporaryDirectory() as folder:
            save(model, folder)
            load_local(folder, tokenizer=False)
    """,
    # the registry: lists and resolves without building anything
    "zoo.plugin.current": """
        from zoo.plugin.current import get_registry
        registry = get_registry()
        registry.resolve("gpt2-124m")
        registry.models()
    """,
}

#: What each layer must never load: the layers above it.
ABOVE = {
    "zoo.kernels": ("zoo.nn", "zoo.quant", "zoo.adapters", "zoo.runtime", "zoo.plugin"),
    "zoo.nn": (
        "zoo.quant",
        "zoo.adapters",
        "zoo.runtime",
        "zoo.plugin.current",
        "zoo.plugin.host",
        "zoo.checkpoint",
        "zoo.hub",
        "zoo.api",
        "zoo.loading",
        "zoo.cli",
        "zoo.train",
        "zoo.generation",
        "zoo.serve",
    ),
    "zoo.tokenizers": (
        "torch",
        "zoo.plugin",
        "zoo.nn",
        "zoo.checkpoint",
        "zoo.hub",
        "zoo.api",
        "zoo.loading",
        "zoo.cli",
        "zoo.generation",
        "zoo.serve",
        "zoo.train",
    ),
    "zoo.runtime": (
        "zoo.quant",
        "zoo.adapters",
        "zoo.plugin.current",
        "zoo.plugin.host",
        "zoo.checkpoint",
        "zoo.hub",
        "zoo.generation",
        "zoo.api",
        "zoo.loading",
        "zoo.cli",
        "zoo.train",
        "zoo.serve",
    ),
    "zoo.generation": (
        "zoo.plugin.current",
        "zoo.checkpoint",
        "zoo.hub",
        "zoo.api",
        "zoo.loading",
        "zoo.cli",
        "zoo.train",
        "zoo.serve",
    ),
    "zoo.serve": ("zoo.hub", "zoo.api", "zoo.loading", "zoo.cli", "zoo.train"),
    "zoo.train": ("zoo.hub", "zoo.api", "zoo.loading", "zoo.cli", "zoo.serve"),
    "zoo.checkpoint": ("zoo.hub", "zoo.api", "zoo.loading", "zoo.cli", "zoo.train"),
    "zoo.plugin.current": (
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


LAYOUT = ROOT.parent / "docs" / "layout.md"
#: Modules beside the layers (docs/layout.md): tools that import nothing else of zoo.
BESIDE = ("zoo.localhub",)


def _layers() -> dict[str, int]:
    """Package -> its row in the table of layers of docs/layout.md (0 at the bottom)."""
    rows: dict[str, int] = {}
    for line in LAYOUT.read_text(encoding="utf-8").splitlines():
        row = re.match(r"\| (\d+) \| (.*?) \|", line)
        if row:
            rows.update({name: int(row[1]) for name in re.findall(r"`([\w.]+)`", row[2])})
    return rows


def _home(module: str, layers: dict[str, int]) -> str | None:
    """The package of the map that ``module`` is in (the longest that matches)."""
    homes = [p for p in layers if module == p or module.startswith(f"{p}.")]
    return max(homes, key=len, default=None)


def test_every_import_goes_down_the_layout_map():
    # docs/layout.md's table is the map: a module imports its own package and the rows below
    # it (row 0, plain Python, may import within itself), and every zoo module is on the map
    layers, graph = _layers(), _graph()
    assert len(layers) > 10, "the table of layers in docs/layout.md was not found"
    zoo = [m for m in graph if m.startswith("zoo.") and not m.startswith(BESIDE)]
    assert [m for m in zoo if _home(m, layers) is None] == [], "modules missing from the map"
    wrong = []
    for module in zoo:
        home = _home(module, layers)
        for target in sorted(graph[module]):
            there = _home(target, layers)
            if there is None or there == home:
                continue
            if layers[there] > layers[home] or (layers[there] == layers[home] > 0):
                wrong.append(f"{module} (layer {layers[home]}) -> {target} ({layers[there]})")
    assert wrong == [], "imports that do not go down a layer:\n" + "\n".join(wrong)
    beside = {t for m in graph if m.startswith(BESIDE) for t in graph[m]}
    assert {t for t in beside if not t.startswith(BESIDE)} == set()


def _listed(text: str) -> tuple[dict[str, str], list[str]]:
    """docs/layout.md's list of every module: dotted name -> its description (a package is
    its ``### `zoo.x``` heading, each module a ``- `name`: its job`` line under it), and
    the lines of that list that are not one of those."""
    listed: dict[str, str] = {}
    odd: list[str] = []
    section = f"\n{text}".partition("\n## Every module, by package\n")[2].partition("\n## ")[0]
    package = None
    for line in section.splitlines():
        heading = re.match(r"### `(zoo(?:\.\w+)*)`", line)
        item = re.match(r"- `(\w+)`(?: \(\d+\))?: (\S.*)", line)
        if heading:
            package = heading[1]
            listed[package] = line
        elif item and package:
            listed[f"{package}.{item[1]}"] = item[2]
        elif line.startswith(("- ", "#")):
            odd.append(line)
    return listed, odd


def test_the_layout_page_lists_every_module_and_no_other():
    # each module of zoo/ has a line with its job under its package's heading, and every
    # module the page names (in that list, and in the table's package column) exists
    modules = {m for m in _modules() if m == "zoo" or m.startswith("zoo.")}
    text = LAYOUT.read_text(encoding="utf-8")
    listed, odd = _listed(text)
    assert odd == [], "lines of the module list that name no module as `name`: its job"
    missing = sorted(modules - set(listed))
    assert missing == [], f"modules of zoo/ that docs/layout.md does not list: {missing}"
    gone = sorted(set(listed) - modules)
    assert gone == [], f"docs/layout.md lists modules that zoo/ does not have: {gone}"
    assert sorted(set(_layers()) - modules) == [], "the table names modules zoo/ lacks"


def test_the_module_list_reader_sees_a_missing_and_a_stray_module():
    page = "## Every module, by package\n\n### `zoo.a` (layer 1)\n\n- `b`: its job\n- `c`\n"
    listed, odd = _listed(page + "\n## Next\n\n### `zoo.z`\n")
    assert set(listed) == {"zoo.a", "zoo.a.b"}
    assert odd == ["- `c`"]
    assert listed["zoo.a.b"] == "its job"


if __name__ == "__main__":  # the rings of today's tree, one per line
    found = _graph()
    for ring in _rings(found):
        print(_describe(ring, found))
