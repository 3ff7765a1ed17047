"""zoo's float32 product for a few rows (``zoo_gemm_f32``: a slot batch's step, a beam
search's beams) on gpt2-124m's 48 block products, each weight streamed from memory (12 sets of
four, 85M floats, past any cache), by rows and by instruction set variant (AVX2's 4x2 tile,
AVX-512's 4x4: the same bits). The variants take turns within each round; the table gives
the median pass over ``--rounds``.

    python benchmarks/bench_gemm_rows.py [--rows 1 4 8 16] [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_facts

from zoo.kernels.native_load import _library
from zoo.settings import NATIVE_ISAS

#: gpt2-124m's block products, (out, in) each: qkv, attention output, up, down.
SHAPES = ((2304, 768), (768, 768), (3072, 768), (768, 3072))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    lib = _library()
    if lib is None:
        sys.exit("zoo's kernels are not built here (pip install -e .)")
    isas = [i for i, _ in enumerate(NATIVE_ISAS) if lib.zoo_native_set_isa(i) == 0]
    weights = [(torch.randn(n, k), torch.randn(n)) for _ in range(12) for n, k in SHAPES]
    threads = torch.get_num_threads()
    print("| rows | " + " | ".join(f"{NATIVE_ISAS[i]} ms (GFLOP/s)" for i in isas) + " |")
    print("|---:|" + "---:|" * len(isas))
    for m in args.rows:
        inputs = {k: torch.randn(m, k) for k in (768, 3072)}
        out = torch.empty(m, 3072)
        times: dict[int, list[float]] = {i: [] for i in isas}
        for _ in range(args.rounds + 1):  # the first round warms up
            for i in isas:
                lib.zoo_native_set_isa(i)
                start = time.perf_counter()
                for w, b in weights:
                    n, k = w.shape
                    x = inputs[k]
                    lib.zoo_gemm_f32(
                        w.data_ptr(), x.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, threads
                    )
                times[i].append(time.perf_counter() - start)
        flops = sum(2 * m * w.numel() for w, _ in weights)
        cells = []
        for i in isas:
            t = statistics.median(times[i][1:])
            cells.append(f"{t * 1e3:.2f} ({flops / t / 1e9:.0f})")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print(f"\n{threads} threads. Machine: {machine_facts()}")


if __name__ == "__main__":
    main()
