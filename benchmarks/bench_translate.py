"""Translation on CPU: zoo against CTranslate2 and transformers on ``opus-mt-en-de``'s shape,
beam search, float32 and int8.

    pip install ctranslate2 sentencepiece
    python benchmarks/bench_translate.py --rounds 3 --markdown benchmarks/RESULTS-translate.md

The model is ``Helsinki-NLP/opus-mt-en-de``'s configuration with random weights (the Hub is
not reachable here; :mod:`translate_fixture` writes it from the published config and saves
it with transformers, and CTranslate2's ``ct2-transformers-converter`` converts that folder
with ``--quantization float32`` and ``int8``). Every engine translates the same sources
(``--sentences`` lines of held-out Tiny Shakespeare of 10 to 40 ids each, ``</s>``
included, tokenized by the folder's SentencePiece tokenizer: tokenizing is not timed) with
the same search: ``--beams`` beams, at most ``--max-new-tokens`` new tokens, length penalty
1, no n-gram blocking, ``early_stopping`` False, ``<pad>`` never generated (CTranslate2's
conversion drops it from the vocabulary; zoo and transformers are given
``bad_words_ids=[[pad]]``), no forced end token (the published generation config forces
``</s>`` at ``max_length``; CTranslate2 has no such rule, so zoo and transformers are run
without it). Batches of 1 and 16 sentences, in the sources' order, padded on the right.

Engines: ``zoo float32`` (``zoo.load`` of the folder), ``zoo int8`` (``quantize="int8"``),
``transformers float32`` (``MarianMTModel``), ``transformers int8`` (torch.ao's dynamic
quantization of every ``nn.Linear``, per output channel as zoo's int8 is), ``ct2 float32``,
``ct2 int8`` (CTranslate2's default CPU ISA, which it chooses from the CPU's vendor: AVX2 on
AMD, whatever the CPU has), and ``ct2 ...+avx512`` (``CT2_FORCE_CPU_ISA=AVX512``, where the
CPU has AVX-512). Each engine runs in its own process, loaded once, with ``--threads``
threads (torch's intra-op threads; CTranslate2's ``intra_threads`` with one translator).
One warm-up pass, then ``--rounds`` rounds; in each round, for each batch size, every engine
translates all the sources, the engines in a different order each round. A figure is the
median over rounds; the report gives the load average around the rounds. Tokens are the
generated ids of each sentence's best hypothesis, its end token excluded.

The report also says, at each batch size, for how many sentences each engine's best
hypothesis equals ``zoo float32``'s and its own precision's transformers' (zoo and
transformers in float32 compute the same search, so the same tokens are expected;
CTranslate2 and the int8 schemes may part from them where two hypotheses' scores are close).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import cpu_flags, machine_facts, publish

ENGINES = [
    "zoo float32",
    "ct2 float32",
    "transformers float32",
    "zoo int8",
    "ct2 int8",
    "transformers int8",
    "ct2 float32+avx512",
    "ct2 int8+avx512",
]


@dataclass(frozen=True)
class Search:
    """The settings every engine is given."""

    beams: int = 4
    max_new_tokens: int = 64
    pad: int = 58100
    eos: int = 0


# --------------------------------------------------------------------------- engines


def _right_padded(batch: list[list[int]], pad: int) -> tuple[Any, Any]:
    import torch

    width = max(len(row) for row in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def _new_tokens(rows: Any, search: Search) -> list[list[int]]:
    """Each row's ids after the start token, up to (not including) its first end token."""
    found = []
    for row in rows.tolist():
        new = row[1:]
        found.append(new[: new.index(search.eos)] if search.eos in new else new)
    return found


class ZooEngine:
    """``zoo.generate`` with ``num_beams`` on a ``zoo.load`` of the folder."""

    def __init__(self, folders: dict[str, Path], precision: str, search: Search) -> None:
        import dataclasses

        import zoo

        quantize = "int8" if precision == "int8" else None
        self.model = zoo.load(folders["hf"], quantize=quantize)
        found = self.model.generation_config  # the published one, without its forced end
        self.model.generation_config = dataclasses.replace(found, forced_eos_token_id=None)
        self.zoo, self.search = zoo, search

    def translate(self, batch: list[list[int]]) -> list[list[int]]:
        s = self.search
        ids, mask = _right_padded(batch, s.pad)
        out = self.zoo.generate(
            self.model,
            ids,
            attention_mask=mask,
            num_beams=s.beams,
            max_new_tokens=s.max_new_tokens,
            length_penalty=1.0,
            early_stopping=False,
            no_repeat_ngram_size=0,
            bad_words_ids=[[s.pad]],
        )
        return _new_tokens(out, s)


class TransformersEngine:
    """``MarianMTModel.generate`` with ``num_beams``; int8: torch.ao's dynamic quantization."""

    def __init__(self, folders: dict[str, Path], precision: str, search: Search) -> None:
        import torch
        import transformers

        model = transformers.MarianMTModel.from_pretrained(folders["hf"]).eval()
        if precision == "int8":
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            model = quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig})
        self.model, self.torch, self.search = model, torch, search

    def translate(self, batch: list[list[int]]) -> list[list[int]]:
        s = self.search
        ids, mask = _right_padded(batch, s.pad)
        with self.torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                num_beams=s.beams,
                max_new_tokens=s.max_new_tokens,
                max_length=None,
                length_penalty=1.0,
                early_stopping=False,
                no_repeat_ngram_size=0,
                bad_words_ids=[[s.pad]],
                forced_eos_token_id=None,
            )
        return _new_tokens(out, s)


class CT2Engine:
    """``ctranslate2.Translator.translate_batch`` of the converted model (token strings)."""

    def __init__(self, folders: dict[str, Path], precision: str, search: Search) -> None:
        import json

        import ctranslate2

        folder = folders[f"ct2 {precision}"]
        threads = int(os.environ["OMP_NUM_THREADS"])
        self.translator = ctranslate2.Translator(
            str(folder), device="cpu", intra_threads=threads, inter_threads=1
        )
        vocabulary = json.loads((folder / "shared_vocabulary.json").read_text())
        self.tokens = vocabulary
        self.ids = {token: i for i, token in enumerate(vocabulary)}
        self.search = search

    def translate(self, batch: list[list[int]]) -> list[list[int]]:
        s = self.search
        source = [[self.tokens[i] for i in row] for row in batch]
        results = self.translator.translate_batch(
            source,
            beam_size=s.beams,
            max_decoding_length=s.max_new_tokens,
            length_penalty=1.0,
            no_repeat_ngram_size=0,
            max_batch_size=0,
        )
        return [[self.ids[t] for t in r.hypotheses[0]] for r in results]


def _engine(name: str, folders: dict[str, Path], search: Search) -> Any:
    kind, precision = name.split()
    precision = precision.split("+")[0]
    cls = {"zoo": ZooEngine, "transformers": TransformersEngine, "ct2": CT2Engine}[kind]
    return cls(folders, precision, search)


def _serve(name: str, folders: dict[str, Path], search: Search, conn: Any) -> None:
    """An engine's process: load, then translate each batch list it is sent, answering
    the seconds it took and the new tokens of each sentence."""
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    engine = _engine(name, folders, search)
    conn.send("ready")
    while (batches := conn.recv()) is not None:
        start = time.perf_counter()
        out = [tokens for batch in batches for tokens in engine.translate(batch)]
        conn.send((time.perf_counter() - start, out))


@dataclass
class Worker:
    """A running engine process and its end of the pipe."""

    name: str
    process: Any
    conn: Any
    seconds: dict[int, list[float]] = field(default_factory=dict)
    outputs: dict[int, list[list[int]]] = field(default_factory=dict)

    def run(self, batches: list[list[list[int]]], size: int, timed: bool) -> None:
        self.conn.send(batches)
        seconds, out = self.conn.recv()
        if timed:
            self.seconds.setdefault(size, []).append(seconds)
            if self.outputs.setdefault(size, out) != out:
                raise RuntimeError(f"{self.name} translated differently in two rounds")

    def close(self) -> None:
        self.conn.send(None)
        self.process.join()


def _start(name: str, folders: dict[str, Path], search: Search, threads: int) -> Worker:
    """Start an engine's process with ``threads`` threads (and CTranslate2's forced ISA)."""
    context = mp.get_context("spawn")
    ours, theirs = context.Pipe()
    saved = dict(os.environ)
    os.environ.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    if name.endswith("+avx512"):
        os.environ["CT2_FORCE_CPU_ISA"] = "AVX512"
    try:
        process = context.Process(target=_serve, args=(name, folders, search, theirs))
        process.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if ours.recv() != "ready":
        raise RuntimeError(f"{name} did not start")
    return Worker(name, process, ours)


# --------------------------------------------------------------------------- the run


def _batched(sources: list[list[int]], size: int) -> list[list[list[int]]]:
    return [sources[i : i + size] for i in range(0, len(sources), size)]


def measure(
    workers: list[Worker], sources: list[list[int]], sizes: list[int], rounds: int
) -> tuple[float, float]:
    """Warm up, then ``rounds`` interleaved rounds; the load averages before and after."""
    for worker in workers:
        for size in sizes:
            worker.run(_batched(sources, size)[:1], size, timed=False)
    load_before = os.getloadavg()[0]
    for r in range(rounds):
        order = workers[r % len(workers) :] + workers[: r % len(workers)]
        for size in sizes:
            for worker in order:
                worker.run(_batched(sources, size), size, timed=True)
        print(f"round {r + 1}/{rounds} done, load {os.getloadavg()[0]:.1f}", flush=True)
    return load_before, os.getloadavg()[0]


def _same(a: list[list[int]], b: list[list[int]] | None) -> str:
    if b is None:
        return "-"
    return f"{sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}"


def table(workers: list[Worker], sentences: int, sizes: list[int]) -> str:
    """The markdown table: each engine at each batch size."""
    by_name = {w.name: w for w in workers}
    lines = [
        "| engine | batch | sentences/s | tokens/s | median s | rounds (s) | "
        "same as zoo float32 | same as transformers (its precision) |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for size in sizes:
        for w in workers:
            times = w.seconds[size]
            median = statistics.median(times)
            out = w.outputs[size]
            tokens = sum(len(t) for t in out)
            zoo32 = by_name.get("zoo float32")
            peer = by_name.get(f"transformers {w.name.split()[1].split('+')[0]}")
            rounds = ", ".join(f"{t:.2f}" for t in times)
            lines.append(
                f"| {w.name} | {size} | {sentences / median:.2f} | {tokens / median:.1f} | "
                f"{median:.2f} | {rounds} | "
                f"{_same(out, zoo32.outputs[size] if zoo32 else None)} | "
                f"{_same(out, peer.outputs[size] if peer else None)} |"
            )
    return "\n".join(lines)


def ct2_isa(folder: Path) -> str:
    """The ISA and GEMM backends CTranslate2 picks here by default (its verbose log on
    loading the model in ``folder``)."""
    import subprocess
    import sys

    code = f"import ctranslate2; ctranslate2.Translator({str(folder)!r}, device='cpu')"
    env = {**os.environ, "CT2_VERBOSE": "1"}
    env.pop("CT2_FORCE_CPU_ISA", None)
    log = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    ).stderr
    wanted = ("Selected ISA", "SGEMM backend", "GEMM_S8 backend")
    picked = [line.split("]")[-1].strip(" -") for line in log.splitlines()]
    return "; ".join(p for p in picked if p.startswith(wanted)) or "not reported"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--sentences", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/zoo-bench-translate"))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import ctranslate2
    import transformers
    import translate_fixture as fixture

    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engines {unknown}; choose from {ENGINES}")
    if "avx512f" not in cpu_flags().split():
        names = [n for n in names if not n.endswith("+avx512")]
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    search = Search(beams=args.beams, max_new_tokens=args.max_new_tokens)
    folders = fixture.build(args.workdir)
    tokenizer = transformers.MarianTokenizer.from_pretrained(folders["hf"])
    sources = fixture.sources(tokenizer, args.sentences)
    workers = [_start(name, folders, search, args.threads) for name in names]
    try:
        load_before, load_after = measure(workers, sources, sizes, args.rounds)
    finally:
        for worker in workers:
            worker.close()
    source_ids = sum(len(s) for s in sources)
    isa = ct2_isa(folders["ct2 float32"])
    report = "\n\n".join(
        [
            table(workers, len(sources), sizes),
            f"{len(sources)} sources ({source_ids} ids, `</s>` included), beam "
            f"{search.beams}, at most {search.max_new_tokens} new tokens; medians of "
            f"{args.rounds} interleaved rounds, {args.threads} threads per engine; load "
            f"average {load_before:.1f} before the rounds, {load_after:.1f} after.",
            f"CTranslate2 {ctranslate2.__version__} picks by default: {isa}.",
            f"Machine: {machine_facts('torch', 'transformers', 'ctranslate2')}.",
        ]
    )
    publish(report, title="Translation: zoo, CTranslate2 and transformers", markdown=args.markdown)


if __name__ == "__main__":
    main()
