"""Training speed: zoo's trainer vs a plain loop over ``transformers.GPT2LMHeadModel`` with
``torch.optim.AdamW``, on an identical GPT-2 config, batch and data; and 2-process DDP.

    python benchmarks/bench_train.py --repeats 3 --markdown benchmarks/RESULTS-train.md

Each measurement is a fresh process (peak RSS is per process) that trains ``--steps`` steps on
Tiny Shakespeare tokenized with GPT-2's BPE; the first ``--warmup`` steps are not timed. The
engines are interleaved repeat by repeat; the table shows medians and the ratio to the
transformers loop. Tokens/s counts every token of every sequence of a step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from common import machine_facts, publish

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"
SIZE = {"n_layers": 4, "d_model": 256, "n_heads": 4, "d_ff": 1024, "context_length": 128}

CHILD = textwrap.dedent(
    """
    import json, resource, sys, time, torch
    engine, out = sys.argv[1], sys.argv[5]
    steps, warmup, batch = (int(a) for a in sys.argv[2:5])
    size = json.loads(sys.argv[6])
    torch.manual_seed(0)
    tokens = batch * size["context_length"]
    if engine == "zoo":
        import zoo
        from zoo.train import TrainConfig, train
        model = zoo.build("gpt2-124m", dropout=0.0, **size)
        config = TrainConfig(steps=steps, batch_size=batch, warmup=2, eval_every=0, eval_batches=1)
        # time per step from the loop's own clock, warm-up steps excluded: two runs
        short = TrainConfig(**{**config.__dict__, "steps": warmup})
        first = train(model, sys.argv[7], out + "-a", config=short, log=None)
        model = zoo.build("gpt2-124m", dropout=0.0, **size)
        full = train(model, sys.argv[7], out + "-b", config=config, log=None)
        seconds = full.seconds - first.seconds
    else:
        import numpy as np
        import transformers, zoo
        cfg = transformers.GPT2Config(n_layer=size["n_layers"], n_embd=size["d_model"],
            n_head=size["n_heads"], n_inner=size["d_ff"], n_positions=size["context_length"],
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg).train()
        ids = np.array(zoo.tokenizer("gpt2-124m").encode(open(sys.argv[7]).read()))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        g = torch.Generator().manual_seed(0)
        ctx = size["context_length"]
        for step in range(steps):
            if step == warmup:
                start = time.perf_counter()
            s = torch.randint(0, len(ids) - ctx - 1, (batch,), generator=g).tolist()
            w = torch.from_numpy(np.stack([ids[i : i + ctx + 1] for i in s]).astype(np.int64))
            logits = model(w[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tok_s": tokens * (steps - warmup) / seconds, "peak_mb": peak}))
    """
)


def run(engine: str, args: argparse.Namespace, out: Path) -> dict:
    argv = [engine, str(args.steps), str(args.warmup), str(args.batch), str(out),
            json.dumps(SIZE), str(DATA)]  # fmt: skip
    result = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{engine} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"transformers": [], "zoo": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = ["transformers", "zoo"] if repeat % 2 == 0 else ["zoo", "transformers"]
            for engine in order:
                results[engine].append(run(engine, args, Path(tmp) / f"{engine}-{repeat}"))
    base = statistics.median(r["tok_s"] for r in results["transformers"])
    rows = ["| loop | tokens/s | vs transformers | peak RSS (MB) |", "|---|---:|---:|---:|"]
    for engine, label in (("transformers", "plain loop over `GPT2LMHeadModel` + AdamW"),
                          ("zoo", "`zoo.train.train`")):  # fmt: skip
        tok_s = statistics.median(r["tok_s"] for r in results[engine])
        peak = statistics.median(r["peak_mb"] for r in results[engine])
        rows.append(f"| {label} | {tok_s:,.0f} | {tok_s / base:.2f}x | {peak:,.0f} |")
    size = ", ".join(f"{k} {v}" for k, v in SIZE.items())
    report = "\n".join(rows) + (
        f"\n\nGPT-2 layout ({size}, vocabulary 50257, dropout 0), batch {args.batch}, "
        f"{args.steps} steps of which {args.warmup} untimed, medians of {args.repeats} "
        f"interleaved repeats. Machine: {machine_facts('torch', 'transformers')}; "
        f"load {os.getloadavg()[0]:.2f}."
    )
    publish(report, title="Training speed", markdown=args.markdown)


if __name__ == "__main__":
    main()
