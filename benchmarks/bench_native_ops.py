"""What a call of zoo's kernels costs on each path: one 768-wide layer norm of one row (gpt2's
width) called many times, through the eager wrapper, the kernel function it calls, the
custom operator ``torch.ops.zoo.layer_norm`` through PyTorch's dispatcher (registered with
``torch.library.Library``'s ``define``/``impl``, as :mod:`zoo.kernels.ops` registers it),
the same implementation registered with ``torch.library.custom_op`` instead, and compiled
code calling the operator; PyTorch's ``F.layer_norm`` for scale.

The work is the same C call on every path: the differences are each path's own cost per
call. The cases are interleaved (a round runs each once, in turn), on one thread.

    python benchmarks/bench_native_ops.py [--calls 20000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_facts, publish

from zoo.kernels import native, ops


def _custom_op() -> Callable[..., Tensor]:
    """The operator's implementation registered with ``torch.library.custom_op``."""

    @torch.library.custom_op("zoo_bench::layer_norm", mutates_args=())
    def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
        lib = native._library()
        assert lib is not None
        y = ops.layer_norm_kernel(lib, x, weight, bias, eps)
        assert y is not None
        return y

    @layer_norm.register_fake
    def _(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
        return x.new_empty(x.shape)

    return layer_norm


def cases(d: int) -> dict[str, Callable[[], object]]:
    """Each path's call, on the same tensors."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(1, 1, d, generator=g), torch.randn(d, generator=g), torch.randn(d)
    lib = native._library()
    assert lib is not None, "zoo's kernels do not run here: build them (pip install -e .)"
    custom = _custom_op()
    compiled = torch.compile(lambda x: native.layer_norm(x, w, b, 1e-5), fullgraph=True)
    compiled_torch = torch.compile(lambda x: F.layer_norm(x, (d,), w, b, 1e-5), fullgraph=True)
    op = torch.ops.zoo.layer_norm.default
    return {
        "PyTorch `F.layer_norm`": lambda: F.layer_norm(x, (d,), w, b, 1e-5),
        "eager wrapper `native.layer_norm` (checks + C)": lambda: native.layer_norm(x, w, b, 1e-5),
        "kernel function `ops.layer_norm_kernel` (checks + C)": lambda: ops.layer_norm_kernel(
            lib, x, w, b, 1e-5
        ),
        "operator via `Library` define/impl (dispatcher + checks + C)": lambda: op(x, w, b, 1e-5),
        "operator via `torch.library.custom_op` (its wrapping + checks + C)": lambda: custom(
            x, w, b, 1e-5
        ),
        "compiled `native.layer_norm` (guards + operator)": lambda: compiled(x),
        "compiled `F.layer_norm` (guards + Inductor's kernel)": lambda: compiled_torch(x),
    }


def measure(calls: int, rounds: int, d: int) -> str:
    """Microseconds per call of each case: median and best of ``rounds`` interleaved rounds."""
    torch.set_num_threads(1)
    timed = cases(d)
    samples: dict[str, list[float]] = {name: [] for name in timed}
    with torch.no_grad():
        for f in timed.values():  # warm up: compile, first calls
            for _ in range(200):
                f()
        for _ in range(rounds):
            for name, f in timed.items():
                start = time.perf_counter()
                for _ in range(calls):
                    f()
                samples[name].append((time.perf_counter() - start) / calls * 1e6)
    rows = [
        f"| {name} | {statistics.median(s):.2f} | {min(s):.2f} |" for name, s in samples.items()
    ]
    return (
        f"One row of {d} float32 values, layer norm with weight and bias, one thread; "
        f"{rounds} interleaved rounds of {calls} calls per case. Microseconds per call.\n\n"
        "| path | median us/call | best us/call |\n|---|---:|---:|\n" + "\n".join(rows) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per case per round")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds")
    parser.add_argument("--width", type=int, default=768, help="the row's width")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the report")
    args = parser.parse_args()
    load = os.getloadavg()
    part = measure(args.calls, args.rounds, args.width)
    after = os.getloadavg()
    report = (
        f"{machine_facts('torch')}\n\nLoad average (1 min) before {load[0]:.2f}, after "
        f"{after[0]:.2f}\n\n{part}"
    )
    publish(report, title="What a call of zoo's kernels costs on each path", markdown=args.markdown)


if __name__ == "__main__":
    main()
