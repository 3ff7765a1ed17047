"""Time and peak memory of encoding one large text of several shapes: zoo's pieced encode vs
one call to the library (``tokenizers`` or tiktoken), each in a fresh process (peak RSS is per
process).

    python benchmarks/bench_tokenizer_memory.py --mb 20 \\
        --markdown benchmarks/RESULTS-tokenizer-memory.md

Shapes: the same words apart by one space, a newline (one word per line), two spaces, a tab,
or nothing (no whitespace at all: only punctuation and digits part them). Both encodes
produce the same ids (checked). The ``tokenizers`` library builds a full ``Encoding`` per
token (offsets, token strings), about 600 bytes each; zoo cuts the text where no token can
cross (:mod:`zoo.tokenizers.chunking`) and encodes pieces of ~64 K characters, 16 at a time,
so its memory does not grow with the text beyond the ids themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from common import machine_facts, publish

SHAPES = {"space": " ", "lines": "\n", "double": "  ", "tabs": "\t", "none": ""}

CHILD = textwrap.dedent(
    """
    import hashlib, json, resource, sys, time
    import zoo
    mode, mb, name, sep = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
    tok = zoo.tokenizer(name)
    words = "The quick brown fox, 42 times, jumps over the lazy dog; Zoe's cafe!".split()
    unit = sep.join(words) + sep
    text = unit * int(mb * 1_000_000 // len(unit))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "zoo":
        ids = tok.encode(text)
    elif tok.backend == "tiktoken":
        ids = tok.encoding.encode(text, disallowed_special=())
    else:
        ids = tok._as_text.encode(text, add_special_tokens=False).ids
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    print(json.dumps({"s": seconds, "peak_mb": peak / 1024, "base_mb": base / 1024,
                      "tokens": len(ids), "ids": digest}))
    """
)


def run(mode: str, mb: float, name: str, shape: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(mb), name, SHAPES[shape]],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument(
        "--tokenizer",
        action="append",
        help="tokenizer name (repeatable; default: wiki-gpt-wordpiece and gpt2-124m)",
    )
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    rows = [
        "| tokenizer | text shape | zoo s | zoo peak RSS (MB) | library s "
        "| library peak RSS (MB) | tokens |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in args.tokenizer or ["wiki-gpt-wordpiece", "gpt2-124m"]:
        for shape in args.shape or list(SHAPES):
            zoo_run = run("zoo", args.mb, name, shape)
            library = run("library", args.mb, name, shape)
            assert zoo_run["ids"] == library["ids"], f"{name}, {shape}: the pieces changed the ids"
            rows.append(
                f"| `{name}` | {shape} | {zoo_run['s']:.1f} | {zoo_run['peak_mb']:.0f} "
                f"| {library['s']:.1f} | {library['peak_mb']:.0f} | {zoo_run['tokens']:,} |"
            )
    load = os.getloadavg()[0]
    report = "\n".join(rows) + (
        f"\n\n{args.mb:g} MB of text per row; zoo's `tok.encode(text)` and one library call "
        "give the same ids in every row (checked). Shapes: the same words apart by one space, "
        "a newline, two spaces, a tab, or nothing. Machine: "
        f"{machine_facts('tokenizers')}; load {load:.2f}."
    )
    publish(report, title="Encoding a large text: memory", markdown=args.markdown)


if __name__ == "__main__":
    main()
