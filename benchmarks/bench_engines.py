"""zoo against transformers, CTranslate2 and llama.cpp on CPU, by precision: greedy decoding
at batch 1 and 8, prefill, and the peak memory of a process that loads the model and generates.

    pip install 'torch-zoo[bench]'            # CTranslate2, llama-cpp-python (compiles), gguf
    python benchmarks/bench_engines.py --repeats 3 --markdown benchmarks/RESULTS-engines.md

CTranslate2's and llama.cpp's rows are skipped when their package is not installed
(``llama-cpp-python`` builds llama.cpp from source when installed: about 20 minutes on 2 cores).
``zoo int4`` and ``zoo int8-weight`` (weight-only) can be named with ``--engines``; their
PyTorch CPU kernels are slower than float32 on machines without AVX-512 (the README has the
per-layer timings), so they are not in the default set.

gpt2-124m with identical random weights in every engine (zoo's checkpoint, its Hugging Face
export, CTranslate2's conversion of that export, and the model written as GGUF in f32, q8_0
and q4_0 by zoo's writer, ``zoo.export(..., layout="gguf")``, with GPT-2's tokenizer); the
report says whether each engine's greedy tokens equal zoo float32's. ``zoo ...+hf`` loads
the Hugging Face export (what ``zoo generate gpt2-124m`` loads from the Hub); ``zoo
int4+gguf`` loads the q4_0 file with ``quantize="int4"`` (its blocks are zoo's int4 groups,
held as they are), against ``llama.cpp q4_0`` on the same file:

    python benchmarks/bench_engines.py --decode-only --new-tokens 64 --repeats 3 --inner 2 \
        --engines 'zoo int4+gguf' 'llama.cpp q4_0' 'llama.cpp q4_0+own-threads'

Every engine runs in its own fresh process (so peak RSS is that engine's alone),
the engines in a different order each round; each figure is the median over rounds of the
median of ``--inner`` timings in a process. Decoding: a 16-token prompt and 128 new tokens
(every engine made to emit all of them). The "per-step overhead" row decodes with a model of
the same 12 layers but width 64, where the matrix products cost next to nothing: what remains
is each engine's fixed cost per token. ``zoo float32+compile`` decodes with ``compile=True``
(its prefill is the eager one); the "first generation" row includes its compilation, from
torch's on-disk cache after the first round.

Threads: CTranslate2 and ``llama.cpp`` get torch's thread count (zoo's); ``llama.cpp
...+own-threads`` keeps llama-cpp-python's default (half the CPUs). zoo decodes with its
thread policy (``ZOO_DECODE_THREADS``, default ``auto``: the cores other processes leave
free). ``--busy N`` runs N processes that each keep a core busy during the measurements.
``zoo ...+torch-kernels`` runs zoo with ``ZOO_NATIVE_KERNELS=0``: PyTorch's kernels instead
of zoo's own one-row CPU kernels (``zoo.kernels.native``), to show what those bring; ``zoo
...+per-module`` keeps those kernels but not the one-call block step (``zoo.runtime.native_block``),
so each block runs module by module as before it.
``--decode-only`` measures batch-1 decoding only (the per-process peak and first generation
too), by default of the engines the issue's goals name (``DECODE_ENGINES``):

    python benchmarks/bench_engines.py --decode-only --new-tokens 64 --repeats 3 --inner 2
    python benchmarks/bench_engines.py --decode-only --new-tokens 64 --repeats 3 --inner 2 --busy 1
"""

from __future__ import annotations

import argparse
import importlib.util
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

#: The GGUF files made for llama.cpp (and for ``zoo ...+gguf``), by zoo's own GGUF writer.
GGUF_TYPES = ("f32", "q8_0", "q4_0")
#: ``zoo PRECISION+gguf`` loads the GGUF file of this type: q4_0's blocks are zoo's int4.
GGUF_OF = {"float32": "f32", "int8": "q8_0", "int4": "q4_0"}

ENGINES = [
    "zoo float32",
    "zoo float32+compile",
    "zoo bfloat16",
    "zoo int8",
    "transformers float32",
    "ct2 float32",
    "ct2 int8",
    "ct2 int8_float32",
    "llama.cpp f32",
    "llama.cpp q8_0",
]
DECODE_ENGINES = [  # --decode-only's default: the goals, both thread choices of llama.cpp
    "zoo float32",
    "zoo int8",
    "zoo float32+hf",
    "zoo int8+hf",
    "zoo float32+torch-kernels",
    "zoo int8+torch-kernels",
    "zoo float32+per-module",
    "zoo int8+per-module",
    "ct2 float32",
    "ct2 int8",
    "ct2 int8_float32",
    "llama.cpp f32",
    "llama.cpp q8_0",
    "llama.cpp f32+own-threads",
    "llama.cpp q8_0+own-threads",
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
    own_threads = precision.endswith("+own-threads")  # llama-cpp-python's default count
    per_module = precision.endswith("+per-module")
    from_gguf, from_hf = precision.endswith("+gguf"), precision.endswith("+hf")
    for suffix in ("+own-threads", "+torch-kernels", "+per-module", "+gguf", "+hf"):
        precision = precision.removesuffix(suffix)
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
        source = spec["gguf_" + spec["gguf_of"][precision]] if from_gguf else spec["zoo"]
        source = spec["hf"] if from_hf else source  # the path users take: a Hub/HF folder
        model = zoo.load(source, dtype=dtype, quantize=quantize, tokenizer=False)
        if per_module:  # every block module by module: no one-call block step
            import zoo.runtime.native_block
            zoo.runtime.native_block.decode = lambda *args: None
        def decode(ids):  # the thread policy `zoo generate` decodes with
            return zoo.generate(
                model, ids, max_new_tokens=new, temperature=0, compile=compiled, threads="auto"
            )
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
    elif engine == "ct2":
        import ctranslate2
        model = ctranslate2.Generator(spec["ct2"], device="cpu", compute_type=precision,
                                      intra_threads=torch.get_num_threads())
        words = lambda ids: [[f"t{i}" for i in row] for row in ids.tolist()]
        def decode(ids):
            return model.generate_batch(words(ids), max_length=new, min_length=new,
                                        sampling_topk=1, include_prompt_in_result=False)
        def forward(ids):
            return model.forward_batch(words(ids))
    else:  # llama.cpp: one sequence at a time (no batch-8 rows)
        import llama_cpp
        count = torch.get_num_threads()
        threads = {} if own_threads else {"n_threads": count, "n_threads_batch": count}
        model = llama_cpp.Llama(spec["gguf_" + precision], n_ctx=1024, n_batch=512,
                                verbose=False, **threads)
        def decode(ids):
            model.reset()  # no prompt reuse from the last call
            out = []
            for token in model.generate(ids[0].tolist(), top_k=1, temp=0.0, repeat_penalty=1.0):
                out.append(token)
                if len(out) == new:
                    return out
        def forward(ids):
            model.reset()
            model.eval(ids[0].tolist())
    def new_ids(out):  # the batch-1 generation's new tokens
        if engine == "ct2":
            return list(out[0].sequences_ids[0])
        return list(out) if engine == "llama.cpp" else out[0, -new:].tolist()
    start = time.perf_counter()
    first = decode(prompts[1])  # the first generation in this process: it compiles, where it does
    first_s = time.perf_counter() - start
    decode_1 = new / timed(lambda: decode(prompts[1]), warm_up=False)
    if spec.get("tiny"):
        print(json.dumps({"step_ms": 1000 / decode_1}))
        sys.exit()
    out = {"decode_1": decode_1, "first_s": first_s, "peak_mb": peak_mib(), "ids": new_ids(first)}
    if not spec["decode_only"]:
        if engine != "llama.cpp":
            out["decode_8"] = 8 * new / timed(lambda: decode(prompts[8]))
        out["prefill_1x128"] = timed(lambda: forward(prefills[1, 128]))
        if engine != "llama.cpp":
            out["prefill_8x512"] = timed(lambda: forward(prefills[8, 512]))
    print(json.dumps(out))
    """
)

IMPORT_TORCH = PEAK_MIB + "import torch\nprint(peak_mib())\n"


def prepare(folder: Path, sizes: dict[str, int], gguf: bool) -> dict[str, str]:
    """Random gpt2-124m weights as a zoo checkpoint, its HF export, CTranslate2's
    conversion of the export (with a stand-in vocabulary of tokens ``t0`` .. ``t50256``),
    and, when ``gguf``, the model as GGUF in f32, q8_0 and q4_0 (zoo's writer)."""
    import torch

    import zoo

    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", dropout=0.0, **sizes)
    paths = {"zoo": str(folder / "zoo"), "hf": str(folder / "hf"), "ct2": str(folder / "ct2")}
    zoo.save(model, paths["zoo"])
    zoo.export(model, paths["hf"], layout="hf-gpt2")
    model.tokenizer = zoo.tokenizer("gpt2-124m")  # llama.cpp loads no GGUF without one
    for kind in GGUF_TYPES if gguf else ():
        path = folder / f"{kind}.gguf"
        paths[f"gguf_{kind}"] = str(zoo.export(model, path, layout="gguf", type=kind))
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
            "vocab": 50257, "tiny": tiny, "decode_only": args.decode_only,
            "gguf_of": GGUF_OF}  # fmt: skip
    env = dict(os.environ)
    if engine.endswith("+torch-kernels"):  # zoo without its own CPU kernels (zoo.kernels.native)
        env["ZOO_NATIVE_KERNELS"] = "0"
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"{engine} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


PACKAGES = {"ct2": ("ctranslate2",), "llama.cpp": ("llama_cpp", "gguf")}


def installed(engines: list[str]) -> list[str]:
    """``engines`` less those whose packages are missing (each skip is printed)."""
    for key, modules in PACKAGES.items():
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            print(f"{', '.join(missing)} not installed (pip install 'torch-zoo[bench]'): "
                  f"the {key} rows are skipped")  # fmt: skip
            engines = [e for e in engines if e.split()[0] != key]
    return engines


def measure(args: argparse.Namespace) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Every engine's results, a list of rounds each, on the full and the tiny model."""
    full: dict[str, list[dict]] = {e: [] for e in args.engines}
    tiny: dict[str, list[dict]] = {e: [] for e in args.engines}
    gguf = any(e.startswith("llama.cpp") or e.endswith("+gguf") for e in args.engines)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "full").mkdir()
        (Path(tmp) / "tiny").mkdir()
        paths = prepare(Path(tmp) / "full", {}, gguf)
        tiny_paths = prepare(Path(tmp) / "tiny", TINY, gguf)
        with busy(args.busy):
            for round_ in range(args.repeats):
                order = (
                    args.engines[round_ % len(args.engines) :]
                    + args.engines[: round_ % len(args.engines)]
                )
                for engine in order:
                    full[engine].append(run(engine, paths, args, tiny=False))
                    if not args.decode_only:
                        tiny[engine].append(run(engine, tiny_paths, args, tiny=True))
    return full, tiny


#: Greedy tokens compared (leading run, batch 1, first round): each reference's against the
#: engines of its precision (int8 and q8_0 quantize differently: not expected to match).
SAME_TOKENS = {
    "zoo float32": ("float32", "f32"),
    "zoo int4+gguf": ("q4_0",),  # the same q4_0 blocks; llama.cpp rounds activations to 8 bits
}


def same_tokens(full: dict[str, list[dict]]) -> str:
    """How many of each engine's greedy tokens (first round) equal its reference's."""
    counts = []
    for reference, precisions in SAME_TOKENS.items():
        if reference not in full:
            continue
        ours = full[reference][0]["ids"]
        for engine, results in full.items():
            if engine == reference or engine.split()[1].split("+")[0] not in precisions:
                continue
            theirs = results[0]["ids"]
            pairs = enumerate(zip(ours, theirs, strict=False))
            same = next((i for i, (a, b) in pairs if a != b), min(len(ours), len(theirs)))
            counts.append(f"{engine} {same}/{len(ours)} of {reference}'s")
    return f" Greedy tokens equal (leading run, batch 1): {', '.join(counts)}." if counts else ""


RATIOS = [  # the goals: (ours, theirs), and zoo's kernels against PyTorch's
    ("zoo float32", "zoo float32+torch-kernels"),
    ("zoo int8", "zoo int8+torch-kernels"),
    ("zoo float32", "zoo float32+per-module"),
    ("zoo int8", "zoo int8+per-module"),
    ("zoo float32+hf", "zoo float32"),
    ("zoo float32", "ct2 float32"),
    ("zoo float32+hf", "ct2 float32"),
    ("zoo float32", "llama.cpp f32"),
    ("zoo float32", "llama.cpp f32+own-threads"),
    ("zoo int8", "llama.cpp q8_0"),
    ("zoo int8", "llama.cpp q8_0+own-threads"),
    ("zoo int8", "ct2 int8"),
    ("zoo int8", "ct2 int8_float32"),
    ("zoo int4+gguf", "llama.cpp q4_0"),
    ("zoo int4+gguf", "llama.cpp q4_0+own-threads"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all engines")
    parser.add_argument("--inner", type=int, default=3, help="timings per process")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--engines", nargs="*", help="default: all but +own-threads")
    parser.add_argument("--busy", type=int, default=0, help="neighbours spinning a core each")
    parser.add_argument(
        "--decode-only", action="store_true", help="batch-1 decoding only (its own engines)"
    )
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    default = DECODE_ENGINES if args.decode_only else ENGINES
    args.engines = installed(args.engines or default)
    load_before = os.getloadavg()[0]
    full, tiny = measure(args)
    load_after = os.getloadavg()[0]
    torch_mb = float(subprocess.run([sys.executable, "-c", IMPORT_TORCH], capture_output=True,
                                    text=True, check=True).stdout)  # fmt: skip

    def med(engine: str, key: str, table: dict[str, list[dict]] = full) -> float | None:
        values = [r[key] for r in table[engine] if key in r]
        return statistics.median(values) if values else None

    def cell(key: str, form: str, scale: float = 1.0, table: dict[str, list[dict]] = full):
        def show(engine: str) -> str:
            value = med(engine, key, table)
            return "n/a" if value is None else format(scale * value, form)

        return show

    rows = [
        ("decode batch 1 (tok/s)", cell("decode_1", ".1f")),
        ("decode batch 8 (tok/s)", cell("decode_8", ".0f")),
        ("prefill 1x128 (ms)", cell("prefill_1x128", ".0f", 1000)),
        ("prefill 8x512 (s)", cell("prefill_8x512", ".2f")),
        ("per-step overhead, width 64 (ms/token)", cell("step_ms", ".2f", table=tiny)),
        ("peak RSS, load + generate (MiB)", cell("peak_mb", ".0f")),
        ("first batch-1 generation in a process (s)", cell("first_s", ".1f")),
    ]
    if args.decode_only:
        rows = [rows[0], *rows[5:]]
    header = "| measure | " + " | ".join(args.engines) + " |"
    lines = [header, "|---" + "|---:" * len(args.engines) + "|"]
    for label, show in rows:
        lines.append(f"| {label} | " + " | ".join(show(e) for e in args.engines) + " |")
    ratios = [
        f"{a} / {b} {med(a, 'decode_1') / med(b, 'decode_1'):.2f}x"  # type: ignore[operator]
        for a, b in RATIOS
        if a in full and b in full
    ]
    neighbours = described(args.busy) + " ran during the measurements"
    neighbours = neighbours[0].upper() + neighbours[1:]
    report = "\n".join(lines) + (
        (f"\n\nBatch-1 decoding, zoo against its peers: {'; '.join(ratios)}." if ratios else "")
        + f"\n\ngpt2-124m, random weights identical in every engine; 16-token prompts, "
        f"{args.new_tokens} new tokens, greedy; medians of {args.repeats} rounds x "
        f"{args.inner} timings, engines in rotating order, each in its own process (every one "
        f"imports torch, CTranslate2's and llama.cpp's too, to make the prompts). A bare "
        f"`import torch` process peaks at {torch_mb:.0f} MiB.{same_tokens(full)} Threads: "
        f"torch's {torch_threads()} for CTranslate2 and llama.cpp (llama-cpp-python's default, "
        f"in the +own-threads columns, is {max(1, (os.cpu_count() or 2) // 2)}); zoo chooses its "
        f"own per step (ZOO_DECODE_THREADS={os.environ.get('ZOO_DECODE_THREADS') or 'auto'}). "
        f"{neighbours}; load (1 min) {load_before:.2f} before, {load_after:.2f} after. "
        f"Machine: {machine_facts('torch', 'transformers')}."
    )
    publish(report, title="Engines: zoo, transformers, CTranslate2 and llama.cpp on CPU",
            markdown=args.markdown)  # fmt: skip


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
