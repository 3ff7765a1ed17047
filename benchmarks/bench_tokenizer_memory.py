"""Time and peak memory of encoding one large text: zoo's pieced encode vs one call to the
``tokenizers`` library, each in a fresh process (peak RSS is per process).

    python benchmarks/bench_tokenizer_memory.py --mb 20 \\
        --markdown benchmarks/RESULTS-tokenizer-memory.md

Both produce the same ids (checked). The library builds a full ``Encoding`` per token
(offsets, token strings), about 600 bytes each; zoo encodes pieces of ~64 K characters, 16 at
a time, so its memory does not grow with the text beyond the ids themselves.
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

CHILD = textwrap.dedent(
    """
    import hashlib, json, resource, sys, time
    import zoo
    mode, mb, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    tok = zoo.tokenizer(name)
    line = "The quick brown fox, 42 times, jumps over the lazy dog; Zoe's cafe! "
    text = line * int(mb * 1_000_000 // len(line))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "library":
        ids = tok.tokenizer.encode(text, add_special_tokens=False).ids
    else:
        ids = tok.encode(text)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    print(json.dumps({"s": seconds, "peak_mb": peak / 1024, "base_mb": base / 1024,
                      "tokens": len(ids), "ids": digest}))
    """
)


def run(mode: str, mb: float, name: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(mb), name], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--tokenizer", default="wiki-gpt-wordpiece")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    zoo_run, library = run("zoo", args.mb, args.tokenizer), run("library", args.mb, args.tokenizer)
    assert zoo_run["ids"] == library["ids"], "the pieced encode changed the ids"
    rows = [
        "| encode | seconds | peak RSS (MB) | tokens |",
        "|---|---:|---:|---:|",
        *(
            f"| {label} | {r['s']:.1f} | {r['peak_mb']:.0f} | {r['tokens']:,} |"
            for label, r in (("zoo `tok.encode(text)`", zoo_run), ("library, one call", library))
        ),
    ]
    load = os.getloadavg()[0]
    report = "\n".join(rows) + (
        f"\n\n{args.mb:g} MB of text, `{args.tokenizer}`; same ids. Machine: "
        f"{machine_facts('tokenizers')}; load {load:.2f}."
    )
    publish(report, title="Encoding a large text: memory", markdown=args.markdown)


if __name__ == "__main__":
    main()
