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

With ``--train``, it measures training instead: ``zoo.train.train_tokenizer(file, 2000)`` (what
``zoo train --train-tokenizer 2000`` runs) on one file of each shape above plus one word per
line of random words, random Unicode, one run of random letters and random bytes, each in a
fresh process; ``--zoo PATH`` runs another checkout's zoo (e.g. ``git archive`` of an older
commit) for a before/after::

    python benchmarks/bench_tokenizer_memory.py --train --mb 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from common import machine_facts, publish

SHAPES = {"space": " ", "lines": "\n", "double": "  ", "tabs": "\t", "none": ""}
SENTENCE = "The quick brown fox, 42 times, jumps over the lazy dog; Zoe's cafe!"

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


TRAIN_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    if sys.argv[3]:
        sys.path.insert(0, sys.argv[3])
    import zoo
    from zoo.train import train_tokenizer
    assert zoo.__file__.startswith(sys.argv[3]), zoo.__file__
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        tok = train_tokenizer(sys.argv[1], int(sys.argv[2]))
        outcome = f"{tok.vocab_size} ids"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"s": seconds, "peak_mb": peak / 1024, "base_mb": base / 1024,
                      "outcome": outcome}))
    """
)
#: Training shapes beyond SHAPES: one random word per line, random Unicode, one run of random
#: letters (no break at all), random bytes (not UTF-8).
HOSTILE = ("words", "unicode", "letters", "bytes")


def training_file(shape: str, mb: float, folder: Path) -> Path:
    """``mb`` MB of text of ``shape`` (:data:`SHAPES` or :data:`HOSTILE`) in ``folder``,
    written a block at a time: a child's peak RSS starts from its parent's (fork, exec)."""
    rng, letters = random.Random(0), "abcdefghijklmnopqrstuvwxyz"

    def block(size: int) -> bytes:
        if shape in SHAPES:
            unit = SHAPES[shape].join(SENTENCE.split()) + SHAPES[shape]
            return (unit * (size // len(unit))).encode()
        if shape == "words":
            count = size // 8
            return "".join(
                "".join(rng.choices(letters, k=rng.randint(3, 12))) + "\n" for _ in range(count)
            ).encode()
        if shape == "unicode":  # every code point from space to the surrogates, 3 bytes each
            return "".join(map(chr, rng.choices(range(0x20, 0xD800), k=size // 3))).encode()
        if shape == "letters":
            return "".join(rng.choices(letters, k=size)).encode()
        return rng.randbytes(size)

    path = folder / f"{shape}.txt"
    size = int(mb * 1_000_000)
    step = size if shape in SHAPES else 1 << 20  # one block: the sentence repeats whole
    with path.open("wb") as file:
        for start in range(0, size, step):
            file.write(block(min(step, size - start)))
    return path


def train_run(path: Path, vocab: int, zoo_root: str, timeout: float) -> dict:
    """One fresh process training on ``path``: seconds, peak RSS and outcome (or the limit)."""
    start = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-c", TRAIN_CHILD, str(path), str(vocab), zoo_root],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"s": time.perf_counter() - start, "peak_mb": None, "outcome": "timed out"}
    if out.returncode != 0:
        return {"s": None, "peak_mb": None, "outcome": f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_report(args: argparse.Namespace) -> str:
    """The ``--train`` table: one row per shape."""
    rows = [
        "| text shape | s | peak RSS (MB) | outcome |",
        "|---|---:|---:|---|",
    ]
    shapes = args.shape or [*SHAPES, *HOSTILE]
    with tempfile.TemporaryDirectory() as folder:
        for shape in shapes:
            path = training_file(shape, args.mb, Path(folder))
            run_ = train_run(path, args.vocab, args.zoo or "", args.timeout)
            seconds = "-" if run_["s"] is None else f"{run_['s']:.1f}"
            peak = "-" if run_["peak_mb"] is None else f"{run_['peak_mb']:.0f}"
            rows.append(f"| {shape} | {seconds} | {peak} | {run_['outcome'][:90]} |")
            path.unlink()
    load = os.getloadavg()[0]
    return "\n".join(rows) + (
        f"\n\n`train_tokenizer(file, {args.vocab})` on {args.mb:g} MB of each shape, a fresh "
        f"process each (peak RSS includes importing zoo and torch, ~220 MB; seconds exclude "
        f"it; limit {args.timeout:g} s). Machine: {machine_facts('tokenizers')}; load {load:.2f}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--train", action="store_true", help="measure tokenizer training")
    parser.add_argument("--vocab", type=int, default=2000, help="--train: ids to learn")
    parser.add_argument("--zoo", help="--train: the checkout whose zoo to import")
    parser.add_argument("--timeout", type=float, default=300.0, help="--train: per shape")
    parser.add_argument(
        "--tokenizer",
        action="append",
        help="tokenizer name (repeatable; default: wiki-gpt-wordpiece and gpt2-124m)",
    )
    parser.add_argument("--shape", action="append", choices=sorted([*SHAPES, *HOSTILE]))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.train:
        title = "Training a tokenizer: memory and time"
        publish(train_report(args), title=title, markdown=args.markdown)
        return
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
