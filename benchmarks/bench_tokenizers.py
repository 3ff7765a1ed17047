"""Tokenizer benchmark: encode throughput of each zoo tokenizer vs the raw library it wraps.

    python benchmarks/bench_tokenizers.py [--mb 10] [--repeats 5] [--markdown FILE]

The text is ~``--mb`` MB of English built offline and deterministically: the docstrings of the
Python standard library (prose with some code), split into paragraphs, shuffled with a fixed
seed and repeated to size. Its sha256 is printed so runs can be compared.

For each tokenizer the same paragraphs are encoded two ways, by the zoo wrapper and by the
library underneath it called directly with the same semantics (special-token strings allowed,
no sequence tokens added):

- ``encode``: one call per paragraph, in a Python loop (shows any per-call wrapper cost);
- ``encode_batch``: one call with every paragraph (the libraries' parallel batch path).

Raw and zoo are interleaved chunk by chunk (``--chunks``, alternating which goes first), so a
busy machine slows both alike; one repeat encodes the whole text once with each. The table
shows median throughputs and the median of the per-repeat ratio zoo time / raw time (target:
at most 1.10). The gpt1 tokenizer uses the original BPE files vendored in
``tests/data/gpt1`` (or ``--gpt1-dir`` with vocab.json + merges.txt). The subword tokenizer
is trained first (8,000 ids, on the first MB of the text).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import random
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from common import machine_facts, publish

import zoo
from zoo.tokenizers import HFTokenizer, SubwordBPE, TiktokenTokenizer, Tokenizer

REPO = Path(__file__).resolve().parents[1]
GPT1_REFERENCE = REPO / "tests" / "data" / "gpt1"


# -- the text ------------------------------------------------------------------------------------
def stdlib_paragraphs() -> list[str]:
    """English paragraphs from the docstrings of the standard library's modules."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paragraphs: list[str] = []
    for path in sorted(stdlib.rglob("*.py")):
        if any(part in {"test", "tests", "idlelib", "site-packages"} for part in path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    paragraphs.extend(p.strip() for p in doc.split("\n\n") if len(p.strip()) > 40)
    return paragraphs


def build_text(megabytes: float, seed: int = 0) -> list[str]:
    """Shuffled paragraphs totalling about ``megabytes`` MB of UTF-8."""
    source = stdlib_paragraphs()
    rng = random.Random(seed)
    target = int(megabytes * 1_000_000)
    out: list[str] = []
    size = 0
    while size < target:
        block = source[:]
        rng.shuffle(block)
        for paragraph in block:
            out.append(paragraph)
            size += len(paragraph.encode()) + 1
            if size >= target:
                break
    return out


# -- the contestants -----------------------------------------------------------------------------
def raw_calls(tokenizer: Tokenizer) -> tuple[Callable[[str], list[int]], Callable]:
    """The wrapped library's own encode and batch encode, with the wrapper's semantics."""
    if isinstance(tokenizer, TiktokenTokenizer):
        enc = tokenizer.encoding

        def raw_encode(text: str) -> list[int]:
            return enc.encode(text, allowed_special="all")

        def raw_batch(texts: list[str]) -> list[list[int]]:
            return enc.encode_batch(texts, allowed_special="all")

        return raw_encode, raw_batch
    if isinstance(tokenizer, HFTokenizer):
        tk = tokenizer.tokenizer

        def raw_encode(text: str) -> list[int]:
            return tk.encode(text, add_special_tokens=False).ids

        def raw_batch(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in tk.encode_batch_fast(texts, add_special_tokens=False)]

        return raw_encode, raw_batch
    raise TypeError(f"no raw library known for {type(tokenizer).__name__}")


def tokenizers_under_test(paragraphs: list[str], gpt1_dir: Path | None) -> list[Tokenizer]:
    found = [zoo.tokenizer("gpt2-124m")]
    if gpt1_dir is not None:
        found.append(zoo.tokenizer("gpt1", directory=gpt1_dir))
    elif (GPT1_REFERENCE / "encoder_bpe_40000.json").is_file():
        from zoo_plugins.gpt1.tokenizer import from_files

        vocab = GPT1_REFERENCE / "encoder_bpe_40000.json"
        found.append(from_files(vocab, GPT1_REFERENCE / "vocab_40000.bpe"))
    else:
        print("gpt1-bpe skipped: no BPE files (pass --gpt1-dir)", file=sys.stderr)
    found.append(zoo.tokenizer("wiki-gpt-wordpiece"))
    first_mb: list[str] = []
    size = 0
    for paragraph in paragraphs:
        first_mb.append(paragraph)
        size += len(paragraph)
        if size > 1_000_000:
            break
    found.append(SubwordBPE.train(first_mb, vocab_size=8000))
    return found


# -- timing --------------------------------------------------------------------------------------
def timed(fn: Callable[[list[str]], object], chunk: list[str]) -> float:
    start = time.perf_counter()
    fn(chunk)
    return time.perf_counter() - start


def chunked(paragraphs: list[str], n_chunks: int) -> list[list[str]]:
    """``paragraphs`` in ``n_chunks`` consecutive slices."""
    step = max(1, -(-len(paragraphs) // n_chunks))
    return [paragraphs[i : i + step] for i in range(0, len(paragraphs), step)]


def bench(
    tokenizer: Tokenizer, paragraphs: list[str], repeats: int, n_chunks: int
) -> list[dict[str, object]]:
    """Time raw and zoo on the same text, interleaved chunk by chunk (alternating which goes
    first) so that both see the same machine load; one repeat = the whole text once each."""
    raw_encode, raw_batch = raw_calls(tokenizer)
    zoo_encode, zoo_batch = tokenizer.encode, tokenizer.encode_batch
    sample = paragraphs[:200]
    if [zoo_encode(p) for p in sample] != [raw_encode(p) for p in sample]:
        raise SystemExit(f"{tokenizer.name}: zoo and raw ids differ; the comparison is void")
    if zoo_batch(sample) != raw_batch(sample):
        raise SystemExit(f"{tokenizer.name}: zoo and raw batch ids differ")
    n_tokens = sum(len(ids) for ids in raw_batch(paragraphs))
    megabytes = sum(len(p.encode()) + 1 for p in paragraphs) / 1e6
    chunks = chunked(paragraphs, n_chunks)
    modes: dict[str, tuple[Callable, Callable]] = {
        "encode": (
            lambda chunk: [raw_encode(p) for p in chunk],
            lambda chunk: [zoo_encode(p) for p in chunk],
        ),
        "encode_batch": (raw_batch, zoo_batch),
    }
    rows = []
    for mode, (raw, wrapped) in modes.items():
        raw(chunks[0])  # warm up (BPE word caches, thread pools)
        wrapped(chunks[0])
        raw_s, zoo_s, ratios = [], [], []
        for repeat in range(repeats):
            raw_total = zoo_total = 0.0
            for j, chunk in enumerate(chunks):
                if (j + repeat) % 2 == 0:
                    raw_total += timed(raw, chunk)
                    zoo_total += timed(wrapped, chunk)
                else:
                    zoo_total += timed(wrapped, chunk)
                    raw_total += timed(raw, chunk)
            raw_s.append(raw_total)
            zoo_s.append(zoo_total)
            ratios.append(zoo_total / raw_total)
        raw_med, zoo_med = statistics.median(raw_s), statistics.median(zoo_s)
        ratio = statistics.median(ratios)
        rows.append(
            {
                "tokenizer": tokenizer.name,
                "library": tokenizer.backend,
                "mode": mode,
                "tokens": n_tokens,
                "raw_mbs": megabytes / raw_med,
                "zoo_mbs": megabytes / zoo_med,
                "ratio": ratio,
            }
        )
        print(
            f"{tokenizer.name:24s} {mode:12s} raw {raw_med:7.3f}s  zoo {zoo_med:7.3f}s  "
            f"ratio {ratio:.3f}  (per repeat: {', '.join(f'{r:.3f}' for r in ratios)})",
            file=sys.stderr,
        )
    return rows


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| tokenizer | library | mode | tokens | raw library MB/s | zoo MB/s | zoo / raw time |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokenizer']} | {r['library']} | {r['mode']} | {r['tokens']:,} | "
            f"{r['raw_mbs']:.2f} | {r['zoo_mbs']:.2f} | {r['ratio']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of the text in MB")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (median)")
    parser.add_argument("--chunks", type=int, default=40, help="interleaving granularity")
    parser.add_argument("--gpt1-dir", type=Path, help="directory with vocab.json + merges.txt")
    parser.add_argument("--markdown", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)

    paragraphs = build_text(args.mb)
    text_bytes = "\n".join(paragraphs).encode()
    digest = hashlib.sha256(text_bytes).hexdigest()[:16]
    header = (
        f"Text: {len(text_bytes) / 1e6:.2f} MB, {len(paragraphs):,} paragraphs of standard "
        f"library docstrings (sha256 {digest}...). Medians of {args.repeats} runs; raw and zoo "
        f"interleaved in {args.chunks} chunks; ratio = median of the per-run zoo / raw time.\n"
        f"Machine: {machine_facts('tiktoken', 'tokenizers')}; "
        f"load average at start {os.getloadavg()[0]:.1f}.\n"
    )
    print(header, file=sys.stderr)
    rows = []
    for tokenizer in tokenizers_under_test(paragraphs, args.gpt1_dir):
        rows.extend(bench(tokenizer, paragraphs, args.repeats, args.chunks))
    worst = max(float(r["ratio"]) for r in rows)  # type: ignore[arg-type]
    verdict = f"Worst zoo / raw time ratio: {worst:.3f} (target <= 1.10)."
    publish(
        f"{header}\n{table(rows)}\n\n{verdict}",
        title="Tokenizer benchmark: zoo wrapper vs the raw library",
        markdown=args.markdown,
    )
    return 0 if worst <= 1.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
