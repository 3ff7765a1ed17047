"""Fine-tuning memory and step time: full fine-tuning, LoRA and QLoRA (int8, int4) in zoo,
against transformers (full) and transformers + peft (LoRA), on the same Llama-shaped model,
weights, batch and data.

    python benchmarks/bench_lora.py --size smollm2-135m --batch 2 --seq 128 --steps 4 \\
        --warmup 1 --repeats 2 --markdown benchmarks/RESULTS-lora.md

The parent builds a random ``transformers.LlamaForCausalLM`` of ``--size`` once and saves
it; each measurement is a fresh process (peak RSS is per process) that loads those weights
(zoo: ``zoo.load(folder, quantize=...)``, memory-mapped, the float pages given back as each
weight is quantized; transformers: ``from_pretrained``), makes the trainable set (every
parameter; or a rank ``--rank`` adapter, alpha twice that, on all seven projections of every
layer: zoo's ``attn.qkv``/``attn.proj``/``ffn.fc``/``ffn.proj``, peft's ``q/k/v/o/gate/
up/down_proj``) and runs the same plain loop: forward, cross-entropy, backward, AdamW step,
on random token ids. The first ``--warmup`` steps are not timed; a run's step time is its
median (wall clock; "CPU s/step", the process's CPU time, moves less with the machine's
load). Engines are interleaved repeat by repeat (order reversed every other repeat); the
table shows medians over repeats and ratios to transformers' full fine-tuning. "Weights"
counts the model's tensors (int8/int4 bytes once quantized) with the adapters. "Peak RSS"
is the process's maximum resident memory (``ru_maxrss``); "over start" subtracts the
resident memory after ``import torch, transformers, peft, zoo`` and before loading.
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

SIZES = {
    "small": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 8192},
    "medium": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8,
               "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 32000},
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152},
}  # fmt: skip
ENGINES = {
    "hf-full": "transformers, full fine-tuning (plain loop, AdamW)",
    "hf-peft": "transformers + peft LoRA",
    "zoo-full": "zoo, full fine-tuning",
    "zoo-lora": "zoo LoRA",
    "zoo-int8": "zoo QLoRA, int8 base",
    "zoo-int4": "zoo QLoRA, int4 base",
}
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

CHILD = textwrap.dedent(
    """
    import json, resource, statistics, sys, time
    import torch, transformers, peft, zoo
    from zoo.adapters.lora import LoRA, adapter_parameters, attach_lora, plan_lora

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    def tensors_mb(model):  # weights (int8/int4 bytes when quantized) and adapters, once
        seen, total = set(), 0
        for value in model.state_dict(keep_vars=True).values():  # torch.ao: (weight, bias)
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
        return total / 2**20

    spec = json.loads(sys.argv[1])
    engine, rank, folder = spec["engine"], spec["rank"], spec["folder"]
    torch.manual_seed(0)
    start_mb = rss_mb()
    if engine.startswith("zoo"):
        quantize = {"zoo-int8": "int8", "zoo-int4": "int4"}.get(engine)
        model = zoo.load(folder, quantize=quantize, tokenizer=False).train()
        if engine == "zoo-full":
            params = list(model.requires_grad_(True).parameters())
        else:
            attach_lora(model, plan_lora(model, LoRA(rank=rank, alpha=2.0 * rank)))
            params = [p for _, p in adapter_parameters(model)]
        forward = model
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.train()
        if engine == "hf-peft":
            config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                     target_modules=spec["projections"])
            model = peft.get_peft_model(model, config)
        params = [p for p in model.parameters() if p.requires_grad]
        forward = lambda ids: model(input_ids=ids).logits
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    g = torch.Generator().manual_seed(0)
    times, cpu, losses = [], [], []
    for step in range(spec["steps"]):
        ids = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"] + 1), generator=g)
        start, start_cpu = time.perf_counter(), time.process_time()
        logits = forward(ids[:, :-1])  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(json.dumps({
        "step_s": statistics.median(times[spec["warmup"]:]),
        "cpu_s": statistics.median(cpu[spec["warmup"]:]),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "start_mb": start_mb,
        "tensors_mb": tensors_mb(model),
        "trainable": sum(p.numel() for p in params),
        "loss": losses[0],
    }))
    """
)


def make_model(size: str, folder: Path) -> int:
    """A random Llama of ``size`` saved to ``folder`` (safetensors); its parameter count."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **SIZES[size], max_position_embeddings=2048, rope_theta=100000.0,
        tie_word_embeddings=True, rms_norm_eps=1e-5,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def run(engine: str, args: argparse.Namespace, folder: Path) -> dict:
    spec = {
        "engine": engine,
        "rank": args.rank,
        "folder": str(folder),
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "seq": args.seq,
        "vocab": SIZES[args.size]["vocab_size"],
        "projections": PROJECTIONS,
    }
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"{engine} failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def table(results: dict[str, list[dict]]) -> str:
    """The markdown table: medians over repeats, ratios to transformers' full fine-tuning."""
    med = {
        engine: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for engine, runs in results.items()
    }
    base = med["hf-full"]
    rows = [
        "| engine | trainable parameters | step (s) | vs transformers full | CPU s/step "
        "| vs transformers full | weights (MB) | peak RSS (MB) | over start (MB) "
        "| vs transformers full |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for engine, m in med.items():
        over, base_over = m["peak_mb"] - m["start_mb"], base["peak_mb"] - base["start_mb"]
        rows.append(
            f"| {ENGINES[engine]} | {m['trainable']:,.0f} | {m['step_s']:.2f} | "
            f"{m['step_s'] / base['step_s']:.2f}x | {m['cpu_s']:.2f} | "
            f"{m['cpu_s'] / base['cpu_s']:.2f}x | {m['tensors_mb']:,.0f} | "
            f"{m['peak_mb']:,.0f} | {over:,.0f} | "
            f"{over / base_over:.2f}x |"
        )
    lora, theirs = med.get("zoo-lora"), med.get("hf-peft")
    if lora and theirs:
        memory = (lora["peak_mb"] - lora["start_mb"]) / (theirs["peak_mb"] - theirs["start_mb"])
        rows.append(
            f"\nzoo LoRA against transformers + peft LoRA: step time "
            f"{lora['step_s'] / theirs['step_s']:.2f}x (CPU time "
            f"{lora['cpu_s'] / theirs['cpu_s']:.2f}x), memory over start {memory:.2f}x."
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset")
    parser.add_argument("--busy", type=int, default=0, help="neighbours spinning a core each")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    engines = [e for e in ENGINES if e in args.engines.split(",")]
    if "hf-full" not in engines:
        parser.error("--engines must include hf-full (the baseline of the ratios)")
    results: dict[str, list[dict]] = {e: [] for e in engines}
    loads = []
    with tempfile.TemporaryDirectory() as tmp, busy(args.busy):
        folder = Path(tmp) / "model"
        parameters = make_model(args.size, folder)
        for repeat in range(args.repeats):
            for engine in engines if repeat % 2 == 0 else engines[::-1]:
                loads.append(os.getloadavg()[0])
                results[engine].append(run(engine, args, folder))
                print(engine, results[engine][-1], file=sys.stderr)
    size = ", ".join(f"{k} {v}" for k, v in SIZES[args.size].items())
    report = table(results) + (
        f"\n\nLlama layout ({size}, tied embeddings; {parameters:,} parameters, random), "
        f"float32, CPU ({args.threads or os.cpu_count()} threads), batch {args.batch} x "
        f"{args.seq} tokens, LoRA rank {args.rank} "
        f"(alpha {2 * args.rank}) on all 7 projections, AdamW; {args.steps} steps of which "
        f"{args.warmup} untimed, medians of {args.repeats} interleaved repeats; "
        f"{described(args.busy)}. QLoRA int8 "
        "on the CPU is torch.ao's dynamic int8 (activations quantized per call too); int4 "
        "puts int4 on the layers the kernels take (input features a multiple of 128) and "
        "weight-only int8 on the others and on the tied head. Machine: "
        f"{machine_facts('torch', 'transformers', 'peft')}; load average (1 min) "
        f"{min(loads):.2f} to {max(loads):.2f} over the runs."
    )
    publish(report, title="LoRA and QLoRA: memory and step time", markdown=args.markdown)


if __name__ == "__main__":
    main()
