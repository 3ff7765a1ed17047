"""Compiled decoding on CPU (``zoo.generate(..., compile=True)``) against eager decoding.

    python benchmarks/bench_compile.py --repeats 5 --markdown benchmarks/RESULTS-compile.md

Greedy batch-1 decoding (a 16-token prompt, ``--new-tokens`` new tokens) of three models:
the shipped ``shakespeare-byte`` (6 layers, width 192), gpt2-124m's 12 layers at width 64
(the per-step overhead model of ``bench_engines.py``) and gpt2-124m itself (random weights).
Each model runs in a fresh process that first compiles with torch's on-disk cache emptied
(the "cold compile" column: what a first user waits once), then alternates eager and compiled
generations ``--repeats`` times and reports the medians: the two modes see the same machine
load, which a comparison across processes on a shared host does not give.

A second table times the decoding step of ``zoo serve``'s slot batch (``--rows`` sequences
decoding together, each with a 16-token prompt, ``--new-tokens`` steps of every row):
the plain eager step against the static step compiled per shape
(:func:`zoo.runtime.slot_step.slot_batch` with ``compile=True``), with the shapes compiled and
each one's cold compile. ``--only slots`` (or ``single``) runs one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from common import machine_facts, publish

MODELS = {
    "shakespeare-byte": ("shakespeare-byte", {}),
    "gpt2-124m, width 64": ("gpt2-124m", {"d_model": 64, "n_heads": 4, "d_ff": 256}),
    "gpt2-124m": ("gpt2-124m", {}),
}

LOAD = textwrap.dedent(  # the start of each child: the model of argv[1]'s spec
    """
    import json, statistics, sys, time
    import torch, zoo

    spec = json.loads(sys.argv[1])
    if spec["name"] == "shakespeare-byte":
        model = zoo.load(spec["name"], tokenizer=False)
    else:
        torch.manual_seed(0)
        model = zoo.build(spec["name"], **spec["overrides"]).eval()
    """
)

CHILD = LOAD + textwrap.dedent(
    """
    ids = torch.randint(0, min(model.config.vocab_size, 256), (1, 16))
    new = spec["new_tokens"]

    def ms_per_token(compile):
        start = time.perf_counter()
        zoo.generate(model, ids, max_new_tokens=new, temperature=0, compile=compile)
        return (time.perf_counter() - start) * 1000 / new

    cold = ms_per_token(True) * new / 1000  # compiles, with torch's cache emptied
    ms_per_token(False)
    times = {False: [], True: []}
    for _ in range(spec["repeats"]):
        for compile in (False, True):
            times[compile].append(ms_per_token(compile))
    print(json.dumps({"cold_s": cold, "eager": statistics.median(times[False]),
                      "compiled": statistics.median(times[True])}))
    """
)


SLOT_CHILD = LOAD + textwrap.dedent(
    """
    from zoo.runtime.slot_step import slot_batch
    from zoo.runtime.slots import SlotBatch

    rows, new = spec["rows"], spec["new_tokens"]
    prompts = torch.randint(0, min(model.config.vocab_size, 256), (rows, 16)).tolist()
    plain = SlotBatch(model, rows, 16 + new)
    compiled = slot_batch(model, rows, 16 + new, compile=True)

    def ms_per_step(batch, compiles=None):
        batch.clear()
        with torch.inference_mode():
            tokens = torch.stack([batch.add(i, p) for i, p in enumerate(prompts)]).argmax(-1)
            start = time.perf_counter()
            for _ in range(new):
                shapes, before = len(getattr(batch, "shapes_run", ())), time.perf_counter()
                tokens = batch.step(tokens).argmax(-1)  # (rows,)
                if compiles is not None and len(batch.shapes_run) > shapes:
                    compiles.append(time.perf_counter() - before)
        return (time.perf_counter() - start) * 1000 / new

    compiles = []
    ms_per_step(compiled, compiles)  # compiles each shape, with torch's cache emptied
    ms_per_step(plain)
    times = {False: [], True: []}
    for _ in range(spec["repeats"]):
        for which, batch in ((False, plain), (True, compiled)):
            times[which].append(ms_per_step(batch))
    print(json.dumps({"compiles": compiles, "eager": statistics.median(times[False]),
                      "compiled": statistics.median(times[True])}))
    """
)


def _child(code: str, label: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``code`` for one model in a fresh process with an empty on-disk compile cache;
    its last line of output, read as JSON."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        result = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], env=env,
                                capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def single_table(args: argparse.Namespace) -> list[str]:
    """Batch-1 decoding through zoo.generate, eager and compiled."""
    lines = [
        "| model | eager (ms/token) | compiled (ms/token) | speed-up | cold compile (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label in args.models:
        name, overrides = MODELS[label]
        spec = {"name": name, "overrides": overrides, "new_tokens": args.new_tokens,
                "repeats": args.repeats}  # fmt: skip
        r = _child(CHILD, label, spec)
        lines.append(
            f"| {label} | {r['eager']:.2f} | {r['compiled']:.2f} | "
            f"{r['eager'] / r['compiled']:.2f}x | {r['cold_s']:.1f} |"
        )
    lines.append(
        f"\nBatch 1, 16-token prompt, {args.new_tokens} new tokens, greedy; medians of "
        f"{args.repeats} alternating eager/compiled generations per model."
    )
    return lines


def slot_table(args: argparse.Namespace) -> list[str]:
    """The slot batch's step of ``args.rows`` rows, plain eager and compiled per shape."""
    lines = [
        f"| model, {args.rows} rows | eager (ms/step) | compiled (ms/step) | speed-up "
        "| shapes compiled | cold compile per shape (s) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label in args.models:
        name, overrides = MODELS[label]
        spec = {"name": name, "overrides": overrides, "new_tokens": args.new_tokens,
                "repeats": args.repeats, "rows": args.rows}  # fmt: skip
        r = _child(SLOT_CHILD, label, spec)
        cold = ", ".join(f"{c:.1f}" for c in r["compiles"])
        lines.append(
            f"| {label} | {r['eager']:.2f} | {r['compiled']:.2f} | "
            f"{r['eager'] / r['compiled']:.2f}x | {len(r['compiles'])} | {cold} |"
        )
    lines.append(
        f"\nThe slot batch's step (zoo serve's): {args.rows} rows of 16-token prompts, "
        f"{args.new_tokens} steps of every row, greedy; medians of {args.repeats} alternating "
        "eager/compiled runs per model. The compiled step pads the rows to a power of two and "
        "the positions read to a power of two of at least 64: one compiled graph per shape."
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--rows", type=int, default=8, help="slot batch rows (second table)")
    parser.add_argument("--only", choices=("single", "slots"), help="run one table only")
    parser.add_argument(
        "--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="models to run"
    )
    args = parser.parse_args()
    lines = []
    if args.only != "slots":
        lines += single_table(args)
    if args.only != "single":
        lines += ["", *slot_table(args)] if lines else slot_table(args)
    report = "\n".join(lines) + (
        f"\n\nMachine: {machine_facts('torch')}; load {os.getloadavg()[0]:.2f}."
    )
    publish(report, title="Compiled decoding on CPU", markdown=args.markdown)


if __name__ == "__main__":
    main()
