"""Compiled decoding on CPU (``zoo.generate(..., compile=True)``) against eager decoding.

    python benchmarks/bench_compile.py --repeats 5 --markdown benchmarks/RESULTS-compile.md

Greedy batch-1 decoding (a 16-token prompt, ``--new-tokens`` new tokens) of three models:
the shipped ``shakespeare-byte`` (6 layers, width 192), gpt2-124m's 12 layers at width 64
(the per-step overhead model of ``bench_engines.py``) and gpt2-124m itself (random weights).
Each model runs in a fresh process that first compiles with torch's on-disk cache emptied
(the "cold compile" column: what a first user waits once), then alternates eager and compiled
generations ``--repeats`` times and reports the medians: the two modes see the same machine
load, which a comparison across processes on a shared host does not give.
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

from common import machine_facts, publish

MODELS = {
    "shakespeare-byte": ("shakespeare-byte", {}),
    "gpt2-124m, width 64": ("gpt2-124m", {"d_model": 64, "n_heads": 4, "d_ff": 256}),
    "gpt2-124m": ("gpt2-124m", {}),
}

CHILD = textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch, zoo

    spec = json.loads(sys.argv[1])
    if spec["name"] == "shakespeare-byte":
        model = zoo.load(spec["name"], tokenizer=False)
    else:
        torch.manual_seed(0)
        model = zoo.build(spec["name"], **spec["overrides"]).eval()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    lines = [
        "| model | eager (ms/token) | compiled (ms/token) | speed-up | cold compile (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, (name, overrides) in MODELS.items():
        spec = {"name": name, "overrides": overrides, "new_tokens": args.new_tokens,
                "repeats": args.repeats}  # fmt: skip
        with tempfile.TemporaryDirectory() as cache:  # an empty on-disk compile cache
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env,
                                    capture_output=True, text=True)  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{result.stderr[-3000:]}")
        r = json.loads(result.stdout.strip().splitlines()[-1])
        lines.append(
            f"| {label} | {r['eager']:.2f} | {r['compiled']:.2f} | "
            f"{r['eager'] / r['compiled']:.2f}x | {r['cold_s']:.1f} |"
        )
    report = "\n".join(lines) + (
        f"\n\nBatch 1, 16-token prompt, {args.new_tokens} new tokens, greedy; medians of "
        f"{args.repeats} alternating eager/compiled generations per model. Machine: "
        f"{machine_facts('torch')}; load {os.getloadavg()[0]:.2f}."
    )
    publish(report, title="Compiled decoding on CPU", markdown=args.markdown)


if __name__ == "__main__":
    main()
