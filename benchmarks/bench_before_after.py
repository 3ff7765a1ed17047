"""Before and after a change: decoding, training and serving speed of an earlier commit
against the working tree, side by side in one run.

    python benchmarks/bench_before_after.py --before HEAD~5 [--after HEAD] --repeats 5 \\
        --markdown benchmarks/RESULTS-before-after.md
    python benchmarks/bench_before_after.py --before HEAD~5 --repeats 1 --only decode  # smoke

The earlier commit (and ``--after``, else the working tree) is checked out in a temporary git
worktree, and zoo's C kernels are built in it (``build_ext --inplace`` with this interpreter:
the built extension is ignored by git, so a fresh worktree has none and would silently run
PyTorch's kernels). The working tree's own extension is used as it is; one older than its C
sources stops the run (``--build-working-tree`` rebuilds it first). Every measurement is a
fresh process that imports ``zoo`` (and its plugins) from one tree or the other and reports
where it imported zoo from and whether zoo's kernels are available there
(``zoo.kernels.native.available()``, ``zoo.nn.native.available()`` in older trees); the
table says so per tree, and a comparison of a tree with kernels against one without is
refused unless ``--allow-kernel-mismatch``. The two trees alternate in every round so drift
on a shared machine hits both alike. Figures are medians over rounds; the ratio is after /
before (above 1: faster now).

- decoding: gpt2-124m with random weights (one checkpoint, written by the earlier commit and
  loaded by both), a 16-token prompt and 64 greedy steps through a decoding session
  (``zoo.runtime.start_decoding(model, ...)`` where the tree has it, else
  ``model.start_decoding(...)``), at batch 1 and batch 8 (tokens per second, the median of
  five such runs after one that warms up: one run of 64 steps moves by 10% on a quiet host),
  and the prefill of 1 x 128 tokens (ms, the median of 9 calls);
- training: ``zoo.train`` on Tiny Shakespeare bytes with a small GPT-2 (4 layers, width 256,
  context 128, batch 8), time per step with the first steps excluded;
- serving: ``zoo serve`` on the same checkpoint, started from each tree, sent 16
  (``--serve-completions``) streamed greedy completions of 32 tokens by 1 and by 8 concurrent
  clients (generated tokens per second of wall time; the client is ``serve_client.py``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import machine_facts, publish
from serve_client import free_port, load, prompts, running

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"
PARTS = ("decode", "train", "serve")
NAMES = {"decode": "decoding", "train": "training", "serve": "serving"}
#: Where zoo's C extension lives: zoo.kernels now, zoo.nn in older trees.
KERNEL_PACKAGES = ("zoo/kernels", "zoo/nn")

#: Prepended to every script run from a tree. First it drops the import hooks of an editable
#: install of zoo (``pip install -e``): they map ``zoo.*`` and ``zoo_plugins.*`` to the
#: checkout it was installed from, so a module missing from the measured tree (``zoo.kernels``
#: in an older one) would be imported from that checkout instead. Then ``_tree()`` says where
#: zoo was imported from and whether its kernels are available there (None: the tree has none).
TREE = textwrap.dedent(
    """
    import sys
    def _editable_zoo(hook):
        mapping = getattr(sys.modules.get(getattr(hook, "__module__", "")), "MAPPING", {})
        return "zoo" in mapping or "zoo_plugins" in mapping
    sys.meta_path[:] = [f for f in sys.meta_path if not _editable_zoo(f)]
    sys.path_hooks[:] = [h for h in sys.path_hooks if not _editable_zoo(h)]
    sys.path_importer_cache.clear()

    def _tree():
        import importlib, importlib.util, zoo
        kernels = None
        for package in ("zoo.kernels", "zoo.nn"):
            if importlib.util.find_spec(package) and importlib.util.find_spec(package + ".native"):
                kernels = bool(importlib.import_module(package + ".native").available())
                break
        return {"zoo": zoo.__file__, "kernels": kernels}
    """
)

PROBE = TREE + "import json; print(json.dumps({'tree': _tree(), 'measures': {}}))"

DECODE = TREE + textwrap.dedent(
    """
    import importlib.util, json, sys, time, torch, zoo
    if importlib.util.find_spec("zoo.runtime"):
        import zoo.runtime
    start_decoding = getattr(getattr(zoo, "runtime", None), "start_decoding", None)
    api = "zoo.runtime.start_decoding" if start_decoding else "model.start_decoding"
    if start_decoding is None:
        def start_decoding(model, ids, keep, max_new_tokens):
            return model.start_decoding(ids, keep, max_new_tokens)
    torch.manual_seed(0)
    model = zoo.load(sys.argv[1], tokenizer=False)
    out = {}
    with torch.no_grad():
        for batch in (1, 8):
            ids = torch.randint(0, 50257, (batch, 16))
            rates = []
            for _ in range(6):  # the first run warms the kernels up; the median of five
                session = start_decoding(model, ids, None, 64)
                tokens = session.prefill().argmax(-1)
                start = time.perf_counter()
                for _ in range(64):
                    tokens = session.step(tokens).argmax(-1)
                rates.append(batch * 64 / (time.perf_counter() - start))
            out[f"decode batch {batch} (tok/s)"] = sorted(rates[1:])[2]
        ids = torch.randint(0, 50257, (1, 128))
        model(ids)
        times = []
        for _ in range(9):  # one call is too noisy to compare: the median of nine
            start = time.perf_counter()
            model(ids)
            times.append(time.perf_counter() - start)
        out["prefill 1x128 (ms)"] = sorted(times)[4] * 1e3
    print(json.dumps({"tree": {**_tree(), "decoding": api}, "measures": out}))
    """
)

TRAIN = TREE + textwrap.dedent(
    """
    import json, sys, tempfile, torch, zoo
    from zoo.train import TrainConfig, train
    size = dict(n_layers=4, d_model=256, n_heads=4, d_ff=1024, context_length=128,
                vocab_size=257, dropout=0.0)
    times = []
    for steps in (5, 25):  # time per step from the loop's own clock, warm-up excluded
        torch.manual_seed(0)
        config = TrainConfig(steps=steps, batch_size=8, warmup=2, eval_every=0, eval_batches=1)
        with tempfile.TemporaryDirectory() as out:
            result = train(zoo.build("gpt2-124m", **size), sys.argv[1], out, config=config,
                           tokenizer=zoo.tokenizer("byte"), log=None)
        times.append(result.seconds)
    measures = {"train step, small GPT-2 (ms)": (times[1] - times[0]) / 20 * 1e3}
    print(json.dumps({"tree": _tree(), "measures": measures}))
    """
)

#: The server's first line of output is its tree's report, read back from its log.
SERVE_MARK = "zoo-tree "
SERVE = TREE + textwrap.dedent(
    f"""
    import json, sys
    print({SERVE_MARK!r} + json.dumps(_tree()), flush=True)
    from zoo.cli import main
    sys.exit(main())
    """
)

SAVE = TREE + (
    "import json, sys, torch, zoo; torch.manual_seed(0); "
    "zoo.save(zoo.build('gpt2-124m'), sys.argv[1]); print(json.dumps({'measures': {}}))"
)


class Side:
    """One tree being measured: its folder, the site folder that imports zoo from it, and
    what its processes reported."""

    def __init__(self, name: str, tree: Path, site: Path) -> None:
        self.name = name
        self.tree = tree
        self.site = _site(tree, site)
        self.kernels: list[bool | None] = []
        self.decoding: set[str] = set()
        self.rows: dict[str, list[float]] = {}
        self.build_log = ""

    def note(self, tree: dict[str, Any]) -> None:
        """Record one process's report, checking it imported zoo from this tree."""
        imported = Path(tree["zoo"]).resolve()
        if not imported.is_relative_to(self.tree.resolve()):
            raise SystemExit(
                f"the {self.name} tree's measurement imported zoo from {imported}, not from "
                f"{self.tree}: something ahead of PYTHONPATH on sys.path shadows it"
            )
        self.kernels.append(tree["kernels"])
        if "decoding" in tree:
            self.decoding.add(tree["decoding"])

    def add(self, measures: dict[str, float]) -> None:
        for key, value in measures.items():
            self.rows.setdefault(key, []).append(value)

    def kernels_ran(self) -> bool | None:
        """Whether zoo's kernels were available to every one of this tree's processes (True),
        to none (False), or to some only (None)."""
        ran = {bool(k) for k in self.kernels}
        return None if len(ran) != 1 else ran.pop()

    def kernels_label(self) -> str:
        """The table's word for :meth:`kernels_ran`."""
        ran = self.kernels_ran()
        if ran is None:
            return f"mixed ({sum(map(bool, self.kernels))} of {len(self.kernels)} processes)"
        if not ran:
            return "no (no kernels in this tree)" if set(self.kernels) == {None} else "no"
        return "yes"


def _site(tree: Path, into: Path) -> Path:
    """A folder that makes ``import zoo`` and ``import zoo_plugins`` read ``tree``."""
    into.mkdir(parents=True, exist_ok=True)
    for name, target in (("zoo", tree / "zoo"), ("zoo_plugins", tree / "plugins")):
        link = into / name
        if not link.exists():
            link.symlink_to(target)
    return into


def _run(code: str, side: Side, *args: str) -> dict[str, float]:
    """Run ``code`` in a fresh process importing zoo from ``side``'s tree; its measures."""
    env = {**os.environ, "PYTHONPATH": str(side.site), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(  # run from the site folder: `python -c` puts the cwd first on sys.path
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, env=env, cwd=side.site, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"a measurement failed ({side.name}: {side.tree}):\n{out.stderr[-3000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if "tree" in report:
        side.note(report["tree"])
    measures: dict[str, float] = report["measures"]
    return measures


def _extension(tree: Path) -> tuple[Path, list[Path]] | None:
    """The path zoo's C extension is built at in ``tree`` for this interpreter, and its C
    sources; None where the tree has none."""
    suffixes = (sysconfig.get_config_var("EXT_SUFFIX") or ".so", ".abi3.so")
    for package in KERNEL_PACKAGES:
        sources = sorted((tree / package).glob("_native*.[ch]"))
        if sources:
            built = [tree / package / f"_native{suffix}" for suffix in suffixes]
            return next((p for p in built if p.exists()), built[0]), sources
    return None


def _stale(tree: Path) -> str | None:
    """Why ``tree``'s built extension does not match its C sources (None: it does)."""
    found = _extension(tree)
    if found is None:
        return None
    built, sources = found
    if not built.exists():
        return f"{built.relative_to(tree)} is not built"
    newer = [p.name for p in sources if p.stat().st_mtime > built.stat().st_mtime]
    if newer:
        return f"{built.relative_to(tree)} is older than {', '.join(newer)}"
    return None


def _build(side: Side, temp: Path) -> None:
    """Build zoo's C extension in place in ``side``'s tree with this interpreter (setuptools
    skips it where the built file is newer than its sources)."""
    setup = (
        ["setup.py"]
        if (side.tree / "setup.py").exists()
        else ["-c", "from setuptools import setup; setup()"]
    )
    command = [sys.executable, *setup, "build_ext", "--inplace", "--build-temp", str(temp)]
    print(f"building zoo's kernels in the {side.name} tree ({side.tree})", flush=True)
    out = subprocess.run(command, cwd=side.tree, capture_output=True, text=True, check=False)
    side.build_log = (out.stdout + out.stderr)[-2000:]
    if out.returncode != 0:
        raise SystemExit(
            f"building zoo's kernels in the {side.name} tree failed ({' '.join(command)} "
            f"in {side.tree}):\n{side.build_log}"
        )


def _check_kernels(sides: list[Side], allow: bool) -> None:
    """Refuse a comparison of a tree with zoo's kernels against one without (or with them in
    some processes only) unless ``allow``."""
    ran = {side.kernels_ran() for side in sides}
    if allow or (len(ran) == 1 and None not in ran):
        return
    lines = [f"  {side.name} ({side.tree}): {side.kernels_label()}" for side in sides]
    logs = [
        f"the {side.name} tree's kernel build said:\n{side.build_log}"
        for side in sides
        if side.kernels_ran() is not True and side.build_log
    ]
    raise SystemExit(
        "zoo's kernels are not available alike in the two trees:\n"
        + "\n".join(lines)
        + "\nA comparison would measure zoo's kernels against PyTorch's, not the change. Make "
        "the kernels build in both (a C compiler with OpenMP; a CPU with AVX2 and FMA), or pass "
        "--allow-kernel-mismatch to publish it anyway (the table says which tree had them).\n"
        + "\n".join(logs)
    )


def _serve(side: Side, checkpoint: Path, log: Path, completions: int) -> dict[str, float]:
    """``zoo serve`` from one tree: tokens/s of ``completions`` completions by 1 and by 8
    clients."""
    port = free_port()
    command = [sys.executable, "-c", SERVE, "serve", str(checkpoint), "--port", str(port),
               "--served-model-name", "gpt2", "--max-batch", "8",
               "--log-level", "warning"]  # fmt: skip
    texts = prompts(completions)
    old, here = os.environ.get("PYTHONPATH"), os.getcwd()
    os.environ["PYTHONPATH"] = str(side.site)  # read by the server process `running` starts
    os.chdir(side.site)  # its cwd, first on its sys.path, must not hold another zoo
    try:
        with running(command, port, log):
            load(port, "gpt2", texts[:2], 32, 2)  # warm-up
            served = {
                f"serve {clients} client{'s' * (clients > 1)} (tok/s)": load(
                    port, "gpt2", texts, 32, clients
                ).tokens_per_second
                for clients in (1, 8)
            }
    finally:
        os.chdir(here)
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    marks = [line for line in log.read_text().splitlines() if line.startswith(SERVE_MARK)]
    if not marks:
        raise SystemExit(f"the {side.name} tree's server did not report its tree (log: {log})")
    side.note(json.loads(marks[0][len(SERVE_MARK) :]))
    return served


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [part for part in parts if part not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"--only takes a comma-separated list of {', '.join(PARTS)}; got {text!r}"
        )
    return parts


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD", help="the git ref to compare against")
    parser.add_argument(
        "--after", help="a git ref to compare (default: the working tree, uncommitted changes too)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--only", type=_parts, default=PARTS, metavar="PARTS",
        help=f"measure only these, comma-separated (default: {','.join(PARTS)})",
    )  # fmt: skip
    parser.add_argument(
        "--allow-kernel-mismatch", action="store_true",
        help="publish even where zoo's kernels are available in one tree and not the other",
    )  # fmt: skip
    parser.add_argument(
        "--build-working-tree", action="store_true",
        help="rebuild the working tree's kernels first where they are older than their sources",
    )  # fmt: skip
    parser.add_argument(
        "--serve-completions", type=int, default=16, metavar="N",
        help="completions of 32 tokens each serving measurement sends (default 16)",
    )  # fmt: skip
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )


@contextmanager
def _worktrees(work: Path, refs: dict[str, str]) -> Iterator[None]:
    """Each ``name: ref`` checked out (detached) at ``work / name``, removed after."""
    try:
        for name, ref in refs.items():
            out = _git("worktree", "add", "--detach", str(work / name), ref)
            if out.returncode != 0:
                raise SystemExit(f"cannot check out {ref!r} for the {name} tree: {out.stderr}")
        yield
    finally:
        for name in refs:
            _git("worktree", "remove", "--force", str(work / name))


def _prepare(args: argparse.Namespace, work: Path) -> list[Side]:
    """The two sides, their kernels built and probed (refused here, before measuring, where
    they differ)."""
    after_tree = work / "after" if args.after else ROOT
    sides = [
        Side("before", work / "before", work / "site-before"),
        Side("after", after_tree, work / "site-after"),
    ]
    for side in sides:
        if side.tree != ROOT:
            _build(side, work / f"build-{side.name}")
        elif args.build_working_tree:
            _build(side, work / "build-working-tree")
        elif reason := _stale(ROOT):
            raise SystemExit(
                f"the working tree's kernels do not match its C sources ({reason}): rebuild "
                "them (pip install -e ., or `python -c 'from setuptools import setup; setup()' "
                "build_ext --inplace`) or pass --build-working-tree"
            )
        _run(PROBE, side)
    _check_kernels(sides, args.allow_kernel_mismatch)
    return sides


def _measure(args: argparse.Namespace, sides: list[Side], work: Path) -> None:
    checkpoint = work / "gpt2"
    if {"decode", "serve"} & set(args.only):
        # written by the older code, which the newer reads
        _run(SAVE, sides[0], str(checkpoint))
    for round_ in range(args.repeats):
        for side in sides if round_ % 2 == 0 else sides[::-1]:
            if "decode" in args.only:
                side.add(_run(DECODE, side, str(checkpoint)))
            if "train" in args.only:
                side.add(_run(TRAIN, side, str(DATA)))
            if "serve" in args.only:
                log = work / f"serve-{side.name}.log"
                side.add(_serve(side, checkpoint, log, args.serve_completions))
        print(f"round {round_ + 1}/{args.repeats} done", flush=True)


def _and(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(words[:-1]), words[-1]]) if len(words) > 1 else words[0]


def _short(ref: str) -> str:
    return _git("rev-parse", "--short", ref).stdout.strip()


def _table(args: argparse.Namespace, sides: list[Side], load_before: float) -> str:
    before, after = sides
    lines = [
        "| measure | before | after | after / before |",
        "|---|---:|---:|---:|",
    ]
    for key in after.rows:
        old = statistics.median(before.rows[key])
        new = statistics.median(after.rows[key])
        faster = new / old if "tok/s" in key else old / new
        lines.append(f"| {key} | {old:.1f} | {new:.1f} | {faster:.2f}x as fast |")
    same = "same" if before.kernels_ran() == after.kernels_ran() else "**differ**"
    kernels = f"{before.kernels_label()} | {after.kernels_label()}"
    lines.append(f"| zoo's kernels available | {kernels} | {same} |")
    after_name = f"{args.after} ({_short(args.after)})" if args.after else "the working tree"
    decoding = "; ".join(
        f"{side.name} through {', '.join(sorted(side.decoding))}" for side in sides if side.decoding
    )
    lines += [
        "",
        f"Before: {args.before} ({_short(args.before)}); after: {after_name}. Medians of "
        f"{args.repeats} rounds, each measurement a fresh process, the two trees alternating; "
        f"zoo's kernels built in each temporary tree. "
        + (f"Decoding sessions: {decoding}. " if decoding else "")
        + f"Machine: {machine_facts('torch')}. Load average {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after the run.",
    ]
    return "\n".join(lines)


def main() -> None:
    args = _arguments()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        refs = {"before": args.before, **({"after": args.after} if args.after else {})}
        with _worktrees(work, refs):
            sides = _prepare(args, work)
            _measure(args, sides, work)
    _check_kernels(sides, args.allow_kernel_mismatch)  # every measurement's report, not the probe's
    publish(
        _table(args, sides, load_before),
        title=f"Before and after: {_and([NAMES[part] for part in args.only])} speed",
        markdown=args.markdown,
    )


if __name__ == "__main__":
    main()
