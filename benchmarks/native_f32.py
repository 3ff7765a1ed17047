"""The ``float32`` section of ``bench_native.py``: zoo's one-row float32 kernel
(:func:`zoo.kernels.native.linear`, ``zoo_gemv_f32``) against PyTorch's kernels and the memory's
own rate, on gpt2-124m's 49 weights.

One row through each of gpt2-124m's 49 float32 linears (12 layers x q/k/v, attention output
and the MLP's two, then the output layer tied to the embedding: 124 M weights, 497 MB), in
model order, timed as a chain: the time a batch-1 decoding step spends in its matrix-vector
products. Kernels:

- ``F.linear``: PyTorch's default (``addmm``; MKL's or OpenBLAS's gemv for one row),
- ``oneDNN``: ``torch.ops.mkldnn._linear_pointwise``, called as ``zoo/nn/onednn.py`` does
  (zoo's path for batch-1 products before its own kernel),
- ``zoo``: :func:`zoo.kernels.native.linear`,
- ``sum``: ``w.sum()`` over the same weights: no product, only the stream of the weights
  through the cores (the memory-streaming ceiling a matrix-vector product can approach).

Passes are interleaved (every kernel once per pass, in an order that rotates pass by pass),
so all see the same host; each figure is the median over passes, at torch's thread count and
on one thread. GB/s counts the weights' bytes only (the row and the outputs are a few KB).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def f32_weights() -> list[tuple[Any, Any]]:
    """``(weight, bias)`` of gpt2-124m's float32 linears in model order (random, seed 0)."""
    import torch

    import zoo
    from zoo.nn.linear import Linear

    torch.manual_seed(0)
    model = zoo.build("gpt2-124m").eval()
    return [
        (m.weight.detach(), None if m.bias is None else m.bias.detach())
        for m in model.modules()
        if isinstance(m, Linear)
    ]


def f32_kernels() -> dict[str, Callable[[Any, Any, Any], Any]]:
    """The kernels timed, each ``step(x, weight, bias)``; zoo's only where it is available."""
    import torch
    import torch.nn.functional as F

    from zoo.kernels import native

    def onednn(x: Any, w: Any, b: Any) -> Any:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")

    kernels: dict[str, Callable[[Any, Any, Any], Any]] = {"F.linear": F.linear}
    if torch.backends.mkldnn.is_available():
        kernels["oneDNN"] = onednn
    if native.available():
        kernels["zoo"] = native.linear
    kernels["sum"] = lambda x, w, b: w.sum()
    return kernels


def _check(kernels: dict[str, Callable[..., Any]], weights: list, rows: list) -> None:
    """Every product kernel gives F.linear's result (to float32 rounding) on every weight."""
    import torch

    for (w, b), x in zip(weights, rows, strict=True):
        want = kernels["F.linear"](x, w, b)
        for name, step in kernels.items():
            if name != "sum":
                got = step(x, w, b)
                assert got is not None, f"{name} declined a row of {tuple(w.shape)}"
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _timings(
    kernels: dict[str, Callable[..., Any]], weights: list, rows: list, passes: int
) -> dict:
    """Seconds per chain of each kernel, ``passes`` interleaved passes after one warm-up."""
    import torch

    times: dict[str, list[float]] = {name: [] for name in kernels}
    names = list(kernels)
    with torch.no_grad():
        for turn in range(passes + 1):
            order = names[turn % len(names) :] + names[: turn % len(names)]
            for name in order:
                step = kernels[name]
                start = time.perf_counter()
                for (w, b), x in zip(weights, rows, strict=True):
                    step(x, w, b)
                if turn:  # the first pass warms up (page faults, thread start)
                    times[name].append(time.perf_counter() - start)
    return times


def thread_tables(
    kernels: dict[str, Callable[..., Any]],
    weights: list,
    rows: list,
    passes: int,
    mb: float,
    against: str,
    labels: dict[str, str],
) -> list[str]:
    """A table at torch's thread count, then one on one thread, of each kernel's median ms
    per pass (:func:`_timings`), the GB/s of ``mb`` MB of weights, and its time against
    kernel ``against``'s (the int8 section, ``native_int8.py``, shares it)."""
    import torch

    lines = []
    threads = torch.get_num_threads()
    for count in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(count)
        times = _timings(kernels, weights, rows, passes)
        base = statistics.median(times[against])
        lines += [
            f"\n{count} thread{'s' if count > 1 else ''}:\n",
            f"| kernel | median ms per pass | weights GB/s | time / {against}'s |",
            "|---|---:|---:|---:|",
        ]
        for name, seconds in times.items():
            ms = statistics.median(seconds) * 1e3
            ratio = statistics.median(seconds) / base
            lines.append(f"| {labels[name]} | {ms:.1f} | {mb / ms:.1f} | {ratio:.2f}x |")
    torch.set_num_threads(threads)
    return lines


LABELS = {
    "F.linear": "PyTorch `F.linear`",
    "oneDNN": "oneDNN (`mkldnn._linear_pointwise`)",
    "zoo": "zoo (`zoo_gemv_f32`)",
    "sum": "`w.sum()` (streaming ceiling)",
}


def f32_chain(passes: int) -> str:
    """The tables of the float32 section: at torch's thread count, then on one thread."""
    import torch

    weights = f32_weights()
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(1, 1, w.shape[1], generator=g) for w, _ in weights]
    kernels = f32_kernels()
    with torch.no_grad():
        _check(kernels, weights, rows)
    mb = sum(w.numel() * w.element_size() for w, _ in weights) / 1e6
    lines = [
        f"One row through gpt2-124m's {len(weights)} float32 linears ({mb:.0f} MB of weights) "
        f"in model order, {passes} interleaved passes (rotating order); every product "
        "equals F.linear's to float32 rounding. Milliseconds per pass (median), the weights' "
        "GB/s, and the time against `w.sum()`'s.",
    ]
    lines += thread_tables(kernels, weights, rows, passes, mb, "sum", LABELS)
    if "zoo" not in kernels:
        lines.append("\nzoo's kernel is not available here (not built, or no AVX2+FMA).")
    return "\n".join(lines) + "\n"


def f32_section(args: argparse.Namespace) -> str:
    return "## float32\n\n" + f32_chain(args.passes)
