"""zoo's own CPU kernels (zoo/nn/_native*.c) against PyTorch's on gpt2-124m, batch 1.

One section per kernel family, picked with ``--sections`` (default: all):

- ``float32``: the one-row float32 kernel (:mod:`zoo.kernels.native`) against PyTorch's
  ``F.linear``, oneDNN's and a plain ``w.sum()`` (the memory-streaming ceiling), one row
  through gpt2-124m's 49 weights as a chain, interleaved (``native_f32.py``).
- ``int8``: the one-row int8 kernel (:mod:`zoo.kernels.native_int8`) against FBGEMM's, which it
  matches bit for bit, one row through gpt2-124m's 49 int8 linears as a chain, interleaved;
  then ``zoo.generate`` tok/s and memory of gpt2-124m int8 with PyTorch's kernels, zoo's
  with FBGEMM's int8, and zoo's throughout, in alternating processes (``native_int8.py``).

Random weights (``zoo.build``): speed does not depend on the values. The host is shared:
run it on a quiet machine, and read the load (printed) with the figures.

    python benchmarks/bench_native.py [--sections int8] [--passes 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_facts, publish
from native_f32 import f32_section
from native_int8 import int8_section

SECTIONS: dict[str, Callable[[argparse.Namespace], str]] = {
    "float32": f32_section,  # native_f32.py
    "int8": int8_section,  # native_int8.py
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
