"""zoo against transformers and CTranslate2 on CPU, by precision: greedy decoding at batch 1
and 8, prefill, and the peak memory of a process that loads the model and generates.

    pip install 'torch-zoo[bench]'            # CTranslate2; its rows are skipped without it
    python benchmarks/bench_engines.py --repeats 3 --markdown benchmarks/RESULTS-engines.md

``zoo int4`` and ``zoo int8-weight`` (weight-only) can be named with ``--engines``; their
PyTorch CPU kernels are slower than float32 on machines without AVX-512 (the README has the
per-layer timings), so they are not in the default set.

gpt2-124m with identical random weights in every engine (zoo's checkpoint, its Hugging Face
export, and CTranslate2's conversion of that export). Every engine runs in its own fresh
process (so peak RSS is that engine's alone), the engines in a different order each round;
each figure is the median over rounds of the median of ``--inner`` timings in a process.
Decoding: a 16-token prompt and 128 new tokens (every engine made to emit all 128). The
"per-step overhead" row decodes with a model of the same 12 layers but width 64, where the
matrix products cost next to nothing: what remains is each engine's fixed cost per token.
``zoo float32+compile`` decodes with ``compile=True`` (its prefill is the eager one); the
"first generation" row includes its compilation, from torch's on-disk cache after the first
round.
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

from common import machine_facts, publish

ENGINES = [
    "zoo float32",
    "zoo float32+compile",
    "zoo bfloat16",
    "zoo int8",
    "transformers float32",
    "ct2 float32",
    "ct2 int8",
    "ct2 int8_float32",
]
TINY = {"d_model": 64, "n_heads": 4, "d_ff": 256}  # 12 layers, the matrices cost ~nothing

PEAK_MIB = textwrap.dedent(
    """
    import resource

    def peak_mib():  # this process's own high-water mark (ru_maxrss counts the parent's too)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    """
)
CHILD = PEAK_MIB + textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch

    spec = json.loads(sys.argv[1])
    engine, precision = spec["engine"].split()  # "zoo int8-weight", "ct2 int8_float32"...
    precision, compiled = precision.removesuffix("+compile"), precision.endswith("+compile")
    inner, new, vocab = spec["inner"], spec["new_tokens"], spec["vocab"]
    g = torch.Generator().manual_seed(0)
    prompts = {b: torch.randint(0, vocab, (b, 16), generator=g) for b in (1, 8)}
    prefills = {s: torch.randint(0, vocab, s, generator=g) for s in ((1, 128), (8, 512))}

    def timed(fn, warm_up=True):
        if warm_up:
            fn()
        times = []
        for _ in range(inner):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    if engine == "zoo":
        import zoo
        dtype = torch.bfloat16 if precision == "bfloat16" else None
        quantize = precision if precision.startswith("int") else None
        model = zoo.load(spec["zoo"], dtype=dtype, quantize=quantize, tokenizer=False)
        def decode(ids):
            return zoo.generate(model, ids, max_new_tokens=new, temperature=0, compile=compiled)
        def forward(ids):
            with torch.no_grad():
                return model(ids)
    elif engine == "transformers":
        import transformers
        model = transformers.GPT2LMHeadModel.from_pretrained(spec["hf"]).eval()
        def decode(ids):
            return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                  pad_token_id=0)
        def forward(ids):
            with torch.no_grad():
                return model(ids).logits
    else:
        import ctranslate2
        model = ctranslate2.Generator(spec["ct2"], device="cpu", compute_type=precision,
                                      intra_threads=torch.get_num_threads())
        words = lambda ids: [[f"t{i}" for i in row] for row in ids.tolist()]
        def decode(ids):
            return model.generate_batch(words(ids), max_length=new, min_length=new,
                                        sampling_topk=1, include_prompt_in_result=False)
        def forward(ids):
            return model.forward_batch(words(ids))
    start = time.perf_counter()
    decode(prompts[1])  # the first generation in this process: it compiles, where it does
    first_s = time.perf_counter() - start
    decode_1 = new / timed(lambda: decode(prompts[1]), warm_up=False)
    if spec.get("tiny"):
        print(json.dumps({"step_ms": 1000 / decode_1}))
        sys.exit()
    out = {"decode_1": decode_1, "first_s": first_s, "peak_mb": peak_mib()}
    out["decode_8"] = 8 * new / timed(lambda: decode(prompts[8]))
    out["prefill_1x128"] = timed(lambda: forward(prefills[1, 128]))
    out["prefill_8x512"] = timed(lambda: forward(prefills[8, 512]))
    print(json.dumps(out))
    """
)

IMPORT_TORCH = PEAK_MIB + "import torch\nprint(peak_mib())\n"


def prepare(folder: Path, sizes: dict[str, int]) -> dict[str, str]:
    """Random gpt2-124m weights as a zoo checkpoint, its HF export, and CTranslate2's
    conversion of the export (with a stand-in vocabulary of tokens ``t0`` .. ``t50256``)."""
    import torch

    import zoo

    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", dropout=0.0, **sizes)
    paths = {"zoo": str(folder / "zoo"), "hf": str(folder / "hf"), "ct2": str(folder / "ct2")}
    zoo.save(model, paths["zoo"])
    zoo.export(model, paths["hf"], layout="hf-gpt2")
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return paths
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    last = f"t{model.config.vocab_size - 1}"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, "t0")),
        bos_token=last,
        eos_token=last,
        unk_token="t0",
    )
    fast.save_pretrained(paths["hf"])
    subprocess.run(
        ["ct2-transformers-converter", "--model", paths["hf"], "--output_dir", paths["ct2"]],
        check=True,
        capture_output=True,
    )
    return paths


def run(engine: str, paths: dict[str, str], args: argparse.Namespace, tiny: bool) -> dict:
    spec = {**paths, "engine": engine, "inner": args.inner, "new_tokens": args.new_tokens,
            "vocab": 50257, "tiny": tiny}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"{engine} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all engines")
    parser.add_argument("--inner", type=int, default=3, help="timings per process")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--engines", nargs="*", default=ENGINES)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print("CTranslate2 is not installed (pip install 'torch-zoo[bench]'): its rows are skipped")
        args.engines = [e for e in args.engines if not e.startswith("ct2")]
    full: dict[str, list[dict]] = {e: [] for e in args.engines}
    tiny: dict[str, list[dict]] = {e: [] for e in args.engines}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "full").mkdir()
        (Path(tmp) / "tiny").mkdir()
        paths = prepare(Path(tmp) / "full", {})
        tiny_paths = prepare(Path(tmp) / "tiny", TINY)
        for round_ in range(args.repeats):
            order = (
                args.engines[round_ % len(args.engines) :]
                + args.engines[: round_ % len(args.engines)]
            )
            for engine in order:
                full[engine].append(run(engine, paths, args, tiny=False))
                tiny[engine].append(run(engine, tiny_paths, args, tiny=True))
    torch_mb = float(subprocess.run([sys.executable, "-c", IMPORT_TORCH], capture_output=True,
                                    text=True, check=True).stdout)  # fmt: skip

    def med(engine: str, key: str, table: dict[str, list[dict]] = full) -> float:
        return statistics.median(r[key] for r in table[engine])

    rows = [
        ("decode batch 1 (tok/s)", lambda e: f"{med(e, 'decode_1'):.1f}"),
        ("decode batch 8 (tok/s)", lambda e: f"{med(e, 'decode_8'):.0f}"),
        ("prefill 1x128 (ms)", lambda e: f"{1000 * med(e, 'prefill_1x128'):.0f}"),
        ("prefill 8x512 (s)", lambda e: f"{med(e, 'prefill_8x512'):.2f}"),
        ("per-step overhead, width 64 (ms/token)", lambda e: f"{med(e, 'step_ms', tiny):.2f}"),
        ("peak RSS, load + generate (MiB)", lambda e: f"{med(e, 'peak_mb'):.0f}"),
        ("first batch-1 generation in a process (s)", lambda e: f"{med(e, 'first_s'):.1f}"),
    ]
    header = "| measure | " + " | ".join(args.engines) + " |"
    lines = [header, "|---" + "|---:" * len(args.engines) + "|"]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(e) for e in args.engines) + " |")
    report = "\n".join(lines) + (
        f"\n\ngpt2-124m, random weights identical in every engine; 16-token prompts, "
        f"{args.new_tokens} new tokens, greedy; medians of {args.repeats} rounds x "
        f"{args.inner} timings, engines in rotating order, each in its own process (every one "
        f"imports torch, CTranslate2's too, to make the prompts). A bare `import torch` process "
        f"peaks at {torch_mb:.0f} MiB. Machine: "
        f"{machine_facts('torch', 'transformers')}; load {os.getloadavg()[0]:.2f}."
    )
    publish(
        report, title="Engines: zoo, transformers and CTranslate2 on CPU", markdown=args.markdown
    )


if __name__ == "__main__":
    main()
