"""zoo's own CPU kernels (zoo/nn/_native*.c) against PyTorch's on gpt2-124m, batch 1.

One section per kernel family, picked with ``--sections`` (default: all):

- ``float32``: the one-row float32 kernel (:mod:`zoo.nn.native`) against PyTorch's
  ``F.linear``, oneDNN's and a plain ``w.sum()`` (the memory-streaming ceiling), one row
  through gpt2-124m's 49 weights as a chain, interleaved (``native_f32.py``).
- ``int8``: the one-row int8 kernel (:mod:`zoo.nn.native_int8`) against FBGEMM's, which it
  matches bit for bit. ``chain``: one row through each of gpt2-124m's 49 int8 linears in
  turn, the two kernels interleaved pass by pass on the same rows, median ms per pass.
  ``generate``: ``zoo.generate`` tok/s (16-token prompt, ``--new`` greedy tokens, as
  ``bench_engines.py`` counts them) and memory, in child processes alternating three
  settings (:data:`SETTINGS`: ``ZOO_NATIVE_KERNELS=0``, PyTorch's kernels only; zoo's
  kernels with FBGEMM's int8; zoo's kernels throughout), medians over ``--rounds``.

Random weights (``zoo.build``): speed does not depend on the values. The host is shared:
run it on a quiet machine, and read the load (printed) with the figures.

    python benchmarks/bench_native.py [--sections int8] [--passes 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_facts, publish
from native_f32 import f32_section

#: A child for one ``generate`` round: argv[1] is the spec (JSON); prints one JSON line.
GENERATE = """
import gc, json, os, resource, sys, time
import torch, zoo
from zoo.nn import quant
spec = json.loads(sys.argv[1])
if not spec["int8_kernel"]:  # zoo's other kernels, FBGEMM's int8
    quant.int8_linear = lambda layer, x: None
torch.manual_seed(0)
model = zoo.build("gpt2-124m")
quant.quantize_(model, spec["quantize"])
gc.collect()
held = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
ids = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(0))
new = spec["new"]
with torch.no_grad():
    zoo.generate(model, ids, max_new_tokens=new, temperature=0)  # warm-up
    times = []
    for _ in range(spec["inner"]):
        start = time.perf_counter()
        out = zoo.generate(model, ids, max_new_tokens=new, temperature=0)
        times.append(time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"tok_s": new / min(times), "peak_mib": peak, "held_mib": held,
                  "ids": out[0, -new:].tolist()}))
"""


def int8_layers() -> list:
    """gpt2-124m's linears as ``quantize="int8"`` makes them (torch.ao dynamic int8)."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    import zoo
    from zoo.nn.quant import quantize_

    torch.manual_seed(0)
    model = quantize_(zoo.build("gpt2-124m"), "int8")
    return [m for m in model.modules() if isinstance(m, DynamicLinear)]


def chain(layers: list, rows: list, step: Callable) -> float:
    """Seconds for one pass of ``step(layer, row)`` over every layer."""
    start = time.perf_counter()
    for layer, x in zip(layers, rows, strict=True):
        step(layer, x)
    return time.perf_counter() - start


def int8_chain(passes: int) -> str:
    """The ``chain`` table of the int8 section."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from zoo.nn.native_int8 import int8_linear

    layers = int8_layers()
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(1, 1, layer.in_features, generator=g) for layer in layers]
    for layer, x in zip(layers, rows, strict=True):
        got = int8_linear(layer, x)
        assert got is not None and torch.equal(got, DynamicLinear.forward(layer, x))
    steps = {"FBGEMM": DynamicLinear.forward, "zoo": int8_linear}
    times: dict[str, list[float]] = {name: [] for name in steps}
    with torch.no_grad():
        for _ in range(passes):  # interleaved: the two kernels see the same host
            for name, step in steps.items():
                times[name].append(chain(layers, rows, step))
    mb = sum(layer.in_features * layer.out_features for layer in layers) / 1e6
    fb, ours = (statistics.median(times[name]) * 1e3 for name in steps)
    return (
        f"One row through gpt2-124m's {len(layers)} int8 linears ({mb:.0f} MB of int8 "
        f"weights), {passes} interleaved passes, {torch.get_num_threads()} threads; results "
        "equal to the bit:\n\n"
        "| kernel | median ms per pass | weights GB/s |\n|---|---|---|\n"
        f"| FBGEMM (torch.ao dynamic int8) | {fb:.2f} | {mb / fb:.1f} |\n"
        f"| zoo (`zoo_gemv_int8`) | {ours:.2f} | {mb / ours:.1f} |\n\n"
        f"zoo / FBGEMM time: {ours / fb:.2f}x\n"
    )


#: The ``generate`` settings: name, ZOO_NATIVE_KERNELS, whether the int8 kernel runs.
SETTINGS = (
    ("PyTorch's kernels (ZOO_NATIVE_KERNELS=0)", "0", False),
    ("zoo's kernels but FBGEMM's int8", "1", False),
    ("zoo's kernels with zoo's int8", "1", True),
)


def int8_generate(rounds: int, new: int, inner: int) -> str:
    """The ``generate`` table of the int8 section."""
    results: dict[str, list[dict]] = {name: [] for name, _, _ in SETTINGS}
    for _ in range(rounds):
        for name, flag, kernel in SETTINGS:  # alternating, round after round
            spec = {"quantize": "int8", "new": new, "inner": inner, "int8_kernel": kernel}
            run = subprocess.run(
                [sys.executable, "-c", GENERATE, json.dumps(spec)],
                capture_output=True,
                text=True,
                env=dict(os.environ, ZOO_NATIVE_KERNELS=flag),
                check=True,
            )
            results[name].append(json.loads(run.stdout.strip().splitlines()[-1]))
    ours, fbgemm = (results[SETTINGS[i][0]] for i in (2, 1))
    same = all(r["ids"] == ours[0]["ids"] for r in ours + fbgemm)
    lines = [
        f"zoo.generate, gpt2-124m int8, 16-token prompt, {new} greedy tokens, best of {inner} "
        f"per process, median over {rounds} processes each (settings alternating):\n",
        "| kernels | tok/s (median) | each round | RSS after quantizing, MiB | peak RSS MiB |",
        "|---|---|---|---|---|",
    ]
    for name, _, _ in SETTINGS:
        speeds = [r["tok_s"] for r in results[name]]
        held = statistics.median(r["held_mib"] for r in results[name])
        peak = statistics.median(r["peak_mib"] for r in results[name])
        each = ", ".join(f"{s:.1f}" for s in speeds)
        median = statistics.median(speeds)
        lines.append(f"| {name} | {median:.1f} | {each} | {held:.0f} | {peak:.0f} |")
    lines.append(f"\nzoo's int8 kernel and FBGEMM's give the same greedy tokens: {same}\n")
    return "\n".join(lines)


def int8_section(args: argparse.Namespace) -> str:
    return (
        "## int8\n\n"
        + int8_chain(args.passes)
        + "\n"
        + int8_generate(args.rounds, args.new, args.inner)
    )


SECTIONS: dict[str, Callable[[argparse.Namespace], str]] = {
    "float32": f32_section,  # native_f32.py
    "int8": int8_section,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=sorted(SECTIONS), default=None)
    parser.add_argument("--passes", type=int, default=30, help="chain passes per kernel")
    parser.add_argument("--rounds", type=int, default=3, help="generate processes per setting")
    parser.add_argument("--new", type=int, default=64, help="greedy tokens per generation")
    parser.add_argument("--inner", type=int, default=2, help="generations per process")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the report")
    args = parser.parse_args()
    load = os.getloadavg()
    parts = [SECTIONS[name](args) for name in args.sections or SECTIONS]
    after = os.getloadavg()
    report = (
        f"{machine_facts('torch')}\n\nLoad average (1 min) before {load[0]:.2f}, after "
        f"{after[0]:.2f}\n\n" + "\n".join(parts)
    )
    publish(report, title="zoo's native kernels against PyTorch's", markdown=args.markdown)


if __name__ == "__main__":
    main()
