"""zoo's int8 product for many rows (``zoo_linear_int8``: prefill, a slot batch's step)
against FBGEMM's (torch.ao's dynamic int8 linear, which it matches bit for bit), on
gpt2-124m's product shapes as ``quantize="int8"`` makes them: the four block products and the
tied head, random weights. FBGEMM gets its weights packed once, outside the timing (zoo holds
the plain int8 rows only). The kernels take turns within each round; each figure is the median
over ``--rounds`` of one pass over the shapes (the block products of one layer; the head
alone).

    python benchmarks/bench_int8_rows.py [--rows 8 16 128 512] [--rounds 15] [--threads 2]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_facts, publish

from zoo.kernels.ops import per_channel_int8
from zoo.quant.layers import DynamicInt8Linear

#: gpt2-124m's products, (out, in) each: qkv, attention output, up, down; and the head.
BLOCK = ((2304, 768), (768, 768), (3072, 768), (768, 3072))
HEAD = ((50257, 768),)


def kernels(
    shapes: tuple[tuple[int, int], ...],
) -> dict[str, list[Callable[[torch.Tensor], object]]]:
    """zoo's layer and FBGEMM's packed product for each shape, on the same int8 rows."""
    zoo_layers, fbgemm = [], []
    for out, inp in shapes:
        layer = DynamicInt8Linear.from_linear(torch.nn.Linear(inp, out))
        packed = torch.ops.quantized.linear_prepack(
            per_channel_int8(layer.qweight, layer.scale), layer.bias
        )
        zoo_layers.append(layer)
        fbgemm.append(
            lambda x, p=packed: torch.ops.quantized.linear_dynamic(x, p, reduce_range=True)
        )
    return {"zoo": zoo_layers, "FBGEMM": fbgemm}


def timed(calls: list[Callable[[torch.Tensor], object]], inputs: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    for call, x in zip(calls, inputs, strict=True):
        call(x)
    return time.perf_counter() - start


def measure(rows: int, shapes: tuple[tuple[int, int], ...], rounds: int) -> dict[str, float]:
    """Median seconds of one pass over ``shapes`` at ``rows`` rows, per kernel."""
    by_kernel = kernels(shapes)
    inputs = [torch.randn(rows, inp) for _, inp in shapes]
    times: dict[str, list[float]] = {name: [] for name in by_kernel}
    names = list(by_kernel)
    with torch.inference_mode():
        for name in names:  # warm: first calls, allocations
            timed(by_kernel[name], inputs)
        for r in range(rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                times[name].append(timed(by_kernel[name], inputs))
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 128, 512])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = os.getloadavg()[0]
    lines = [
        "| rows | products | zoo (ms) | FBGEMM (ms) | zoo / FBGEMM speed |",
        "|---:|---|---:|---:|---:|",
    ]
    for rows in args.rows:
        for label, shapes in (("one layer's four", BLOCK), ("the head", HEAD)):
            got = measure(rows, shapes, args.rounds)
            lines.append(
                f"| {rows} | {label} | {got['zoo'] * 1e3:.2f} | {got['FBGEMM'] * 1e3:.2f} | "
                f"{got['FBGEMM'] / got['zoo']:.2f}x |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        f"Medians of {args.rounds} rounds, the kernels alternating; {args.threads} threads; "
        f"random weights of gpt2-124m's shapes, quantized per row; load (1 min) "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after. Machine: "
        f"{machine_facts('torch')}.",
    ]
    publish("\n".join(lines), title="int8 products of many rows", markdown=args.markdown)


if __name__ == "__main__":
    main()
