"""The ``int8`` section of ``bench_native.py``: zoo's one-row int8 kernel
(:func:`zoo.kernels.native_int8.int8_linear`, ``zoo_gemv_int8``) against FBGEMM's, which it
matches bit for bit, on gpt2-124m as ``quantize="int8"`` makes it.

``chain``: one row through each of gpt2-124m's 49 int8 linears (zoo's dynamic int8 layers:
124 M int8 weights, 124 MB) in model order, timed as a chain: the time a batch-1 int8
decoding step spends in its matrix-vector products. Kernels:

- ``FBGEMM``: torch.ao's dynamic linear on the same weights packed for FBGEMM once (what
  ``quantize="int8"`` ran before zoo's kernels),
- ``zoo``: :func:`zoo.kernels.native_int8.int8_linear`,
- ``sum``: a float32 ``sum()`` over the same int8 bytes: no product, only the stream of the
  weights through the cores (the memory-streaming ceiling).

Passes are interleaved (every kernel once per pass, in an order that rotates pass by pass),
each figure the median over passes, at torch's thread count and on one thread.

``generate``: ``zoo.generate`` tok/s (16-token prompt, ``--new`` greedy tokens, the whole
call as ``bench_engines.py`` counts it) and memory, in child processes alternating the
:data:`SETTINGS`, medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from native_f32 import thread_tables

#: A child for one ``generate`` round: argv[1] is the spec (JSON); prints one JSON line.
GENERATE = """
import gc, json, os, resource, sys, time
import torch, zoo
from zoo.quant import layers as quant
spec = json.loads(sys.argv[1])
if not spec["int8_kernel"]:  # zoo's other kernels, torch.ao's int8 layers (FBGEMM)
    quant._library = lambda: None
torch.manual_seed(0)
model = zoo.build("gpt2-124m")
quant.quantize_(model, "int8")
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

#: The ``generate`` settings: name, ZOO_NATIVE_KERNELS, whether the int8 kernel runs.
SETTINGS = (
    ("PyTorch's kernels (ZOO_NATIVE_KERNELS=0)", "0", False),
    ("zoo's kernels but FBGEMM's int8", "1", False),
    ("zoo's kernels with zoo's int8", "1", True),
)

LABELS = {
    "FBGEMM": "FBGEMM (torch.ao dynamic int8)",
    "zoo": "zoo (`zoo_gemv_int8`)",
    "sum": "float32 `sum()` over the int8 bytes (streaming ceiling)",
}


def int8_layers() -> list[Any]:
    """gpt2-124m's linears as ``quantize="int8"`` makes them, in model order (seed 0)."""
    import torch

    import zoo
    from zoo.quant.layers import DynamicInt8Linear, quantize_

    torch.manual_seed(0)
    model = quantize_(zoo.build("gpt2-124m"), "int8")
    return [m for m in model.modules() if isinstance(m, DynamicInt8Linear)]


def int8_kernels(layers: list[Any]) -> dict[str, Callable[[Any, Any], Any]]:
    """The kernels timed, each ``step(layer, x)``; zoo's only where it runs."""
    import torch

    from zoo.kernels import native_int8
    from zoo.kernels.ops import per_channel_int8

    packed = {}
    for m in layers:  # FBGEMM's layout, packed once as torch.ao's layer holds it
        w = per_channel_int8(m.qweight, m.scale)
        packed[id(m)] = torch.ops.quantized.linear_prepack(w, m.bias)

    def fbgemm(layer: Any, x: Any) -> Any:
        return torch.ops.quantized.linear_dynamic(x, packed[id(layer)], reduce_range=True)

    kernels: dict[str, Callable[[Any, Any], Any]] = {"FBGEMM": fbgemm}
    if native_int8._kernel() is not None:
        kernels["zoo"] = native_int8.int8_linear
        flat = {id(m): native_int8.rows_of(m).q.view(-1).view(torch.float32) for m in layers}
        kernels["sum"] = lambda layer, x: flat[id(layer)].sum()
    return kernels


def _as_step(kernel: Callable[[Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
    return lambda x, layer, _: kernel(layer, x)


def int8_chain(passes: int) -> str:
    """The chain tables: at torch's thread count, then on one thread."""
    import torch

    layers = int8_layers()
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(1, 1, m.in_features, generator=g) for m in layers]
    kernels = int8_kernels(layers)
    if "zoo" in kernels:
        for layer, x in zip(layers, rows, strict=True):
            assert torch.equal(kernels["zoo"](layer, x), kernels["FBGEMM"](layer, x))
    mb = sum(m.in_features * m.out_features for m in layers) / 1e6
    lines = [
        f"One row through gpt2-124m's {len(layers)} int8 linears ({mb:.0f} MB of int8 "
        f"weights) in model order, {passes} interleaved passes (rotating order); zoo's "
        "results equal FBGEMM's to the bit. Milliseconds per pass (median), the weights' "
        "GB/s, and the time against FBGEMM's.",
    ]
    weights = [(layer, None) for layer in layers]  # native_f32's steps: step(x, w, b)
    steps = {name: _as_step(kernel) for name, kernel in kernels.items()}
    lines += thread_tables(steps, weights, rows, passes, mb, "FBGEMM", LABELS)
    if "zoo" not in kernels:
        lines.append("\nzoo's kernel is not available here (not built, or no AVX2+FMA).")
    return "\n".join(lines) + "\n"


def int8_generate(rounds: int, new: int, inner: int) -> str:
    """The ``generate`` table."""
    results: dict[str, list[dict]] = {name: [] for name, _, _ in SETTINGS}
    for _ in range(rounds):
        for name, flag, kernel in SETTINGS:  # alternating, round after round
            spec = {"new": new, "inner": inner, "int8_kernel": kernel}
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
        "|---|---:|---|---:|---:|",
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
