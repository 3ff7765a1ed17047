"""Many adapters in one server: 8 clients spread over 4 LoRA adapters (``zoo serve BASE
--adapter ...``, every step mixing rows of different adapters) against 8 clients on one
merged model (the base with one adapter folded in, served plainly), tokens/s.

    python benchmarks/bench_serve_adapters.py --markdown benchmarks/RESULTS-serve-adapters.md
    python benchmarks/bench_serve_adapters.py --model shakespeare-byte --rounds 3

The adapters are rank ``--rank`` on the family's default targets with random weights,
saved as peft saves them (recording the base); the merged model is the first of them folded
into the base, saved with ``zoo.save``. Both servers run at once (an idle one costs no CPU)
with ``--max-batch`` slots, and get the same requests: ``--requests`` prompts cut from Tiny
Shakespeare, greedy, ``--max-tokens`` new tokens each, streamed, ``--clients`` at a time;
for the adapter server request ``i`` names adapter ``i % 4``. A third row sends the same
requests to the adapter server under the base's name (no row applies an adapter). Rounds
interleave the rows (their order turns each round); each round's tokens/s is reported, and
the median. The issue's goal: the adapters' median >= 0.7x the merged model's. The texts of
the requests that name the first adapter must equal the merged model's (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_serve import Result, complete, free_port, prompts, running
from common import machine_facts, publish

import zoo
from zoo.adapters import BaseRecord, base_fingerprint, per_part, save_adapter
from zoo.adapters.lora import LoRA, adapter_parameters, attach_lora, merge_lora, plan_lora

ADAPTERS = 4


def make_folders(name: str, rank: int, root: Path) -> tuple[Path, list[Path]]:
    """The merged model's folder and the adapters' folders."""
    base = zoo.load(name).eval()
    record = BaseRecord(name=name, repo=None, revision=None, sha256=base_fingerprint(base))
    folders, merged = [], None
    for i in range(ADAPTERS):
        model = copy.deepcopy(base)
        attach_lora(model, plan_lora(model, LoRA(rank=rank), per_part=per_part(model)))
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for key, p in adapter_parameters(model):
                if key.endswith(".B"):  # A keeps peft's init; B as if trained a little
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        folders.append(save_adapter(model, root / f"a{i}", base=record, lora=LoRA(rank=rank)))
        if i == 0:
            merge_lora(model)
            merged = zoo.save(model, root / "merged", tokenizer=base.tokenizer)
    assert merged is not None
    return merged, folders


def drive(
    port: int, jobs: list[tuple[str, str]], max_tokens: int, clients: int
) -> tuple[float, list[Result]]:
    """Send every ``(model, prompt)``, ``clients`` at a time: tokens/s over the wall time."""

    async def run() -> list[Result]:
        gate = asyncio.Semaphore(clients)

        async def one(model: str, text: str) -> Result:
            async with gate:
                return await complete(port, model, text, max_tokens)

        return list(await asyncio.gather(*(one(m, t) for m, t in jobs)))

    start = time.perf_counter()
    results = asyncio.run(run())
    return sum(r.tokens for r in results) / (time.perf_counter() - start), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="shakespeare-byte")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    texts = prompts(args.requests)
    names = [f"a{i}" for i in range(ADAPTERS)]
    rows = {
        "merged model (one adapter folded in)": [("merged", t) for t in texts],
        f"{ADAPTERS} adapters, mixed in each step": [
            (names[i % ADAPTERS], t) for i, t in enumerate(texts)
        ],
        "adapter server, base only": [(args.model, t) for t in texts],
    }
    rates: dict[str, list[float]] = {row: [] for row in rows}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        merged, folders = make_folders(args.model, args.rank, Path(tmp))
        common = ["--max-batch", str(args.max_batch), "--log-level", "warning"]
        zoo_cli = [sys.executable, "-m", "zoo.cli", "serve"]
        plain, banked = free_port(), free_port()
        adapters = [x for i, f in enumerate(folders) for x in ("--adapter", f"a{i}={f}")]
        with (
            running(
                [
                    *zoo_cli,
                    str(merged),
                    "--served-model-name",
                    "merged",
                    *common,
                    "--port",
                    str(plain),
                ],
                plain,
                Path(tmp) / "merged.log",
            ),  # fmt: skip
            running(
                [*zoo_cli, args.model, *adapters, *common, "--port", str(banked)],
                banked,
                Path(tmp) / "adapters.log",
            ),
        ):
            ports = dict(zip(rows, (plain, banked, banked), strict=True))
            for row, jobs in rows.items():  # warm-up
                drive(ports[row], jobs[: args.clients], 8, args.clients)
            texts_of: dict[str, list[str]] = {}
            for r in range(args.rounds):
                order = list(rows)[r % len(rows) :] + list(rows)[: r % len(rows)]
                for row in order:
                    loads.append(os.getloadavg()[0])
                    rate, results = drive(ports[row], rows[row], args.max_tokens, args.clients)
                    rates[row].append(rate)
                    texts_of[row] = [res.text for res in results]
            loads.append(os.getloadavg()[0])
    merged_row, mixed = list(rows)[:2]
    first = [i for i in range(len(texts)) if i % ADAPTERS == 0]
    same = all(texts_of[mixed][i] == texts_of[merged_row][i] for i in first)
    reference = statistics.median(rates[merged_row])
    lines = [
        f"Model {args.model}; {ADAPTERS} adapters of rank {args.rank} on the default targets; "
        f"{args.requests} streamed greedy completions of {args.max_tokens} tokens by "
        f"{args.clients} clients, --max-batch {args.max_batch}; {args.rounds} interleaved rounds.",
        "",
        "| served | tok/s per round | median tok/s | vs merged |",
        "|---|---|---:|---:|",
    ]
    for row, values in rates.items():
        median = statistics.median(values)
        each = ", ".join(f"{v:.0f}" for v in values)
        lines.append(f"| {row} | {each} | {median:.0f} | {median / reference:.2f}x |")
    lines += [
        "",
        f"Replies of the requests naming the first adapter equal the merged model's: "
        f"{'yes' if same else 'NO'}.",
        "",
        f"Machine: {machine_facts('torch')}. Load average (1 min) before each row's round: "
        f"{', '.join(f'{x:.1f}' for x in loads[:-1])}; after: {loads[-1]:.1f}.",
    ]
    publish("\n".join(lines), title="zoo serve: many adapters at once", markdown=args.markdown)


if __name__ == "__main__":
    main()
