"""Training speed: zoo's trainer vs a plain loop over ``transformers.GPT2LMHeadModel`` with
``torch.optim.AdamW``, on an identical GPT-2 config, batch and data; and zoo under
``torchrun`` with 2 DDP processes against 1 process at the same global batch. ``--layout
llama``: a random ``LlamaForCausalLM`` saved as a Hugging Face folder, which zoo loads
(``zoo.load``) and transformers loads (``from_pretrained``): the same weights in both loops.

    python benchmarks/bench_train.py --repeats 3 --markdown benchmarks/RESULTS-train.md
    python benchmarks/bench_train.py --layout llama --size medium --no-ddp \
        --markdown benchmarks/RESULTS-train-llama.md
    python benchmarks/bench_train.py --device cuda --size gpt2-124m --batch 16 --bf16 \\
        --markdown benchmarks/RESULTS-train-cuda.md      # adds tokens/s and MFU
    python benchmarks/bench_train.py --threads --busy 1 \\
        --markdown benchmarks/RESULTS-train-threads.md

``--threads`` compares zoo's own choice of threads per step (``threads="auto"``: the cores
other processes leave free, what ``zoo train`` does) with each fixed count from 1 to the
machine's cores, beside ``--busy N`` neighbour processes that each keep a core busy.

Each measurement is a fresh process (peak RSS is per process) that trains ``--steps`` steps on
Tiny Shakespeare tokenized with GPT-2's BPE; the first ``--warmup`` steps are not timed. The
engines are interleaved repeat by repeat; the table shows medians and the ratio to the
transformers loop. Tokens/s counts every token of every sequence of a step. MFU (CUDA only)
is the model FLOPs per token (6 x parameters + 12 x layers x context x width, the PaLM
appendix B count) times tokens/s over the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from busy import busy, described
from common import machine_facts, publish

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"
SIZES = {
    "small": {"n_layers": 4, "d_model": 256, "n_heads": 4, "d_ff": 1024, "context_length": 128},
    "gpt2-124m": {"n_layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072,
                  "context_length": 1024},
}  # fmt: skip
#: Llama layouts (``--layout llama``): transformers' ``LlamaConfig`` fields, GPT-2's vocabulary.
LLAMA_SIZES = {
    "small": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "context_length": 128},
    "medium": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8,
               "num_attention_heads": 8, "num_key_value_heads": 4, "context_length": 128},
}  # fmt: skip
#: Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by device-name part.
PEAKS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}

CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time, torch
    spec = json.loads(sys.argv[1])
    engine, steps, warmup, batch = spec["engine"], spec["steps"], spec["warmup"], spec["batch"]
    size, device, bf16 = spec["size"], spec["device"], spec["bf16"]
    torch.manual_seed(0)
    tokens = batch * size["context_length"]
    if engine == "zoo":
        import zoo
        from zoo.train import TrainConfig, train
        config = TrainConfig(steps=steps, batch_size=batch, warmup=2, eval_every=0,
                             eval_batches=1, bf16=bf16)
        # time per step from the loop's own clock, warm-up steps excluded: two runs
        short = TrainConfig(**{**config.__dict__, "steps": warmup})
        def model():  # GPT-2: built at random; Llama: the Hugging Face folder, loaded
            if spec["folder"]:
                return zoo.load(spec["folder"], tokenizer=False)
            return zoo.build("gpt2-124m", dropout=0.0, **size)

        threads, tokenizer = spec.get("threads"), zoo.tokenizer("gpt2-124m")
        first = train(model(), spec["data"], spec["out"] + "-a", config=short, device=device,
                      log=None, threads=threads, tokenizer=tokenizer)
        full = train(model(), spec["data"], spec["out"] + "-b", config=config, device=device,
                     log=None, threads=threads, tokenizer=tokenizer)
        seconds = full.seconds - first.seconds
        parameters = full.model.num_parameters()
    else:
        import numpy as np
        import transformers, zoo
        if spec["folder"]:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                spec["folder"], dtype=torch.float32)
        else:
            cfg = transformers.GPT2Config(n_layer=size["n_layers"], n_embd=size["d_model"],
                n_head=size["n_heads"], n_inner=size["d_ff"],
                n_positions=size["context_length"], resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0)
            model = transformers.GPT2LMHeadModel(cfg)
        model = model.to(device).train()
        parameters = sum(p.numel() for p in model.parameters())
        ids = np.array(zoo.tokenizer("gpt2-124m").encode(open(spec["data"]).read()))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        g = torch.Generator().manual_seed(0)
        ctx = size["context_length"]
        for step in range(steps):
            if step == warmup:
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            s = torch.randint(0, len(ids) - ctx - 1, (batch,), generator=g).tolist()
            w = torch.from_numpy(np.stack([ids[i : i + ctx + 1] for i in s]).astype(np.int64))
            w = w.to(device)
            with torch.autocast(device, torch.bfloat16, enabled=bf16):
                logits = model(w[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                     w[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()  # as zoo's loop reads the loss every step
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpu = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"tok_s": tokens * (steps - warmup) / seconds, "peak_mb": peak,
                          "gpu_mb": gpu, "parameters": parameters}))
    """
)


def llama_folder(size: dict, folder: Path) -> Path:
    """A random ``transformers.LlamaForCausalLM`` of ``size`` (GPT-2's vocabulary, tied
    embeddings) saved to ``folder``: both loops train these weights."""
    import torch
    import transformers

    torch.manual_seed(0)
    fields = {k: v for k, v in size.items() if k != "context_length"}
    config = transformers.LlamaConfig(  # zoo trains on windows of max_position_embeddings
        **fields,
        vocab_size=50257,
        max_position_embeddings=size["context_length"],
        tie_word_embeddings=True,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def run(
    engine: str, args: argparse.Namespace, out: Path, processes: int = 1, threads: object = None
) -> dict:
    spec = {
        "folder": str(args.folder) if args.folder else "",
        "threads": threads,
        "engine": engine,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "size": sizes(args)[args.size],
        "device": args.device,
        "bf16": args.bf16,
        "out": str(out),
        "data": str(DATA),
    }
    script = out.parent / "child.py"
    script.write_text(CHILD)
    launch = [sys.executable]
    if processes > 1:  # torchrun, as a user would launch it
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    cores = os.cpu_count() or 1
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // processes))}
    if isinstance(threads, int):  # a fixed count: torch's own, as a user would set it
        env["OMP_NUM_THREADS"] = str(threads)
    result = subprocess.run(
        [*launch, str(script), json.dumps(spec)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"{engine} x{processes} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def threads_table(args: argparse.Namespace) -> None:
    """zoo's trainer with its own choice of threads against each fixed count, interleaved,
    beside ``args.busy`` busy neighbours."""
    choices: list[object] = ["auto", *range(1, (os.cpu_count() or 1) + 1)]
    results: dict[object, list[dict]] = {choice: [] for choice in choices}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, busy(args.busy):
        for repeat in range(args.repeats):
            for choice in choices if repeat % 2 == 0 else choices[::-1]:
                folder = Path(tmp) / f"{choice}-{repeat}"
                folder.mkdir()
                results[choice].append(run("zoo", args, folder / "run", threads=choice))
    medians = {c: statistics.median(r["tok_s"] for r in results[c]) for c in choices}
    best = max(v for c, v in medians.items() if c != "auto")
    rows = ["| threads | tokens/s | vs the best fixed count |", "|---|---:|---:|"]
    for choice in choices:
        label = "auto (zoo train's default)" if choice == "auto" else f"{choice} (fixed)"
        rows.append(f"| {label} | {medians[choice]:,.0f} | {medians[choice] / best:.2f}x |")
    report = "\n".join(rows) + (
        f"\n\nzoo.train.train, {layout_words(args)}, batch {args.batch}, float32 CPU, "
        f"{args.steps} steps of which {args.warmup} untimed, medians of {args.repeats} "
        f"interleaved repeats; {described(args.busy)}. Load (1 min) {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after. Machine: {machine_facts('torch')}."
    )
    publish(report, title="Training threads: zoo's choice against fixed counts",
            markdown=args.markdown)  # fmt: skip


def sizes(args: argparse.Namespace) -> dict[str, dict]:
    """The sizes of ``--layout``."""
    return LLAMA_SIZES if args.layout == "llama" else SIZES


def layout_words(args: argparse.Namespace) -> str:
    """The model's layout for a report's note."""
    size = ", ".join(f"{k} {v}" for k, v in sizes(args)[args.size].items())
    if args.layout == "llama":
        return f"Llama layout ({size}, vocabulary 50257, tied embeddings; a Hugging Face folder)"
    return f"GPT-2 layout ({size}, vocabulary 50257, dropout 0)"


def flops_per_token(size: dict, parameters: int) -> float:
    """Training FLOPs per token: 6N for the matrices plus the attention scores and values."""
    layers = size.get("n_layers", size.get("num_hidden_layers"))
    width = size.get("d_model", size.get("hidden_size"))
    return 6 * parameters + 12 * layers * size["context_length"] * width


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", choices=sorted({*SIZES, *LLAMA_SIZES}), default="small")
    parser.add_argument(
        "--layout",
        choices=["gpt2", "llama"],
        default="gpt2",
        help="llama: a random LlamaForCausalLM's folder, loaded by both loops",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast in both loops")
    parser.add_argument("--no-ddp", action="store_true", help="skip the 2-process row")
    parser.add_argument("--threads", action="store_true", help="zoo's thread choice vs fixed")
    parser.add_argument("--busy", type=int, default=0, help="neighbours spinning a core each")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.size not in sizes(args):
        parser.error(f"--layout {args.layout} has sizes {', '.join(sorted(sizes(args)))}")
    with tempfile.TemporaryDirectory() as tmp:
        args.folder = None
        if args.layout == "llama":
            args.folder = llama_folder(sizes(args)[args.size], Path(tmp) / "llama")
        if args.threads:
            return threads_table(args)
        return compare(args)


def compare(args: argparse.Namespace) -> None:
    """transformers' plain loop, zoo's trainer and zoo under torchrun, interleaved."""
    runs = [("transformers", 1), ("zoo", 1)]
    if not args.no_ddp and args.device == "cpu":
        runs.append(("zoo", 2))
    results: dict[tuple[str, int], list[dict]] = {key: [] for key in runs}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, busy(args.busy):
        for repeat in range(args.repeats):
            order = runs if repeat % 2 == 0 else runs[::-1]
            for engine, processes in order:
                folder = Path(tmp) / f"{engine}-{processes}-{repeat}"
                folder.mkdir()
                threads = "auto" if (engine, processes) == ("zoo", 1) else None
                result = run(engine, args, folder / "run", processes, threads=threads)
                results[engine, processes].append(result)
    base = statistics.median(r["tok_s"] for r in results["transformers", 1])
    model_class = "LlamaForCausalLM" if args.layout == "llama" else "GPT2LMHeadModel"
    labels = {
        ("transformers", 1): f"plain loop over `{model_class}` + AdamW",
        ("zoo", 1): '`zoo.train.train`, threads="auto" (`zoo train`\'s default)',
        ("zoo", 2): "`zoo.train.train`, 2 DDP processes (torchrun, gloo, 1 thread each)",
    }
    cuda = args.device.startswith("cuda")
    header = "| loop | tokens/s | vs transformers | peak RSS (MB) |"
    header += " peak GPU memory (MB) | MFU |" if cuda else ""
    rows = [header, "|---" + "|---:" * (header.count("|") - 2) + "|"]
    peak_flops = 0.0
    if cuda:
        import torch

        name = torch.cuda.get_device_name()
        peak_flops = next((v for k, v in PEAKS.items() if k in name), 0.0)
    for key in runs:
        tok_s = statistics.median(r["tok_s"] for r in results[key])
        peak = statistics.median(r["peak_mb"] for r in results[key])
        row = f"| {labels[key]} | {tok_s:,.0f} | {tok_s / base:.2f}x | {peak:,.0f} |"
        if cuda:
            gpu = statistics.median(r["gpu_mb"] for r in results[key])
            flops = flops_per_token(sizes(args)[args.size], results[key][0]["parameters"])
            flops *= tok_s
            mfu = f"{flops / peak_flops:.1%}" if peak_flops else "-"
            row += f" {gpu:,.0f} | {mfu} |"
        rows.append(row)
    where = f"CUDA ({name})" if cuda else "CPU"
    report = "\n".join(rows) + (
        f"\n\n{layout_words(args)}, batch {args.batch}, "
        f"{'bf16 autocast, ' if args.bf16 else 'float32, '}{where}, "
        f"{args.steps} steps of which {args.warmup} untimed, medians of {args.repeats} "
        f"interleaved repeats; {described(args.busy)}. Machine: "
        f"{machine_facts('torch', 'transformers')}; load (1 min) {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after."
    )
    if cuda and peak_flops:
        report += f" MFU against a dense bf16 peak of {peak_flops / 1e12:.0f} TFLOP/s."
    publish(report, title="Training speed", markdown=args.markdown)


if __name__ == "__main__":
    main()
