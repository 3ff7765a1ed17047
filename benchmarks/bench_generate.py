"""Generation and forward speed of zoo vs transformers, side by side, on identical weights.

    python benchmarks/bench_generate.py --markdown benchmarks/RESULTS-generate.md
    python benchmarks/bench_generate.py --device cuda --dtype bfloat16    # where a GPU is

Measures gpt2-124m (random weights, the same tensors in both libraries): greedy decode at
batch 1 and 8 (16-token prompts, 128 new tokens), prefill forward (1 x 128, 8 x 512), and the
cold start of ``zoo generate`` to its first token against the equivalent transformers script.
Reports medians over repeats (zoo and transformers alternating), ratios, the machine's read
bandwidth and decode as a share of the bandwidth roofline (bytes read per token ~ the
parameter bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from common import cpu_name, publish

import zoo

PROMPT_LEN = 16


def _timed(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def median_time(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up
    sync()
    return statistics.median(_timed(fn, sync) for _ in range(repeats))


def median_times(
    a: Callable[[], object], b: Callable[[], object], repeats: int, sync: Callable[[], None]
) -> tuple[float, float]:
    """Medians of ``a`` and ``b`` run alternately, so that drift in the machine's speed (a
    shared host) hits both alike."""
    a(), b()  # warm-up
    sync()
    pairs = [(_timed(a, sync), _timed(b, sync)) for _ in range(repeats)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def read_bandwidth(device: torch.device, sync: Callable[[], None]) -> float:
    """Bytes per second of a streaming read (a sum over a buffer far larger than the caches)."""
    n = (1 << 30) // 4 if device.type == "cuda" else (512 << 20) // 4
    x = torch.ones(n, device=device)
    seconds = median_time(lambda: x.sum(), 7, sync)
    return n * 4 / seconds


def make_models(device: torch.device, dtype: torch.dtype, workdir: Path, **overrides: int):
    import transformers

    torch.manual_seed(0)
    model = zoo.build("gpt2-124m", **overrides).eval()
    zoo.save(model, workdir / "zoo")
    zoo.export(model, workdir / "hf", layout="hf-gpt2")
    hf = transformers.GPT2LMHeadModel.from_pretrained(workdir / "hf", dtype=dtype).eval()
    return model.to(device=device, dtype=dtype), hf.to(device)


def cold_start(workdir: Path, repeats: int) -> tuple[float, float]:
    """Seconds from process start to the first generated token, zoo CLI vs transformers."""
    zoo_cmd = [
        sys.executable,
        "-m",
        "zoo.cli",
        "generate",
        str(workdir / "zoo"),
        "Every effort moves you",
        "--max-new-tokens",
        "1",
        "--temperature",
        "0",
    ]
    hf_script = (
        "import sys, torch, transformers, zoo_plugins.gpt2 as g, tiktoken, zoo.tokenizers\n"
        "tok = zoo.tokenizer('gpt2-124m')\n"
        f"m = transformers.GPT2LMHeadModel.from_pretrained({str(workdir / 'hf')!r}).eval()\n"
        "ids = torch.tensor([tok.encode('Every effort moves you')])\n"
        "out = m.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=50256)\n"
        "print(tok.decode(out[0].tolist()))\n"
    )
    hf_cmd = [sys.executable, "-c", hf_script]

    def run(cmd: list[str]) -> float:
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - start

    run(zoo_cmd), run(hf_cmd)  # warm the page cache for both
    pairs = [(run(zoo_cmd), run(hf_cmd)) for _ in range(repeats)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


@contextlib.contextmanager
def eager_steps() -> Iterator[None]:
    """Decode without recording CUDA graphs (``ZOO_CUDA_GRAPHS=0``) inside the block."""
    before = os.environ.get("ZOO_CUDA_GRAPHS")
    os.environ["ZOO_CUDA_GRAPHS"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["ZOO_CUDA_GRAPHS"]
        else:
            os.environ["ZOO_CUDA_GRAPHS"] = before


def step_overhead(
    device: torch.device,
    dtype: torch.dtype,
    workdir: Path,
    n_new: int,
    repeats: int,
    sync: Callable[[], None],
) -> tuple[str, str, str, str, str]:
    """Milliseconds per decoded token of gpt2-124m's 12 layers at width 64, where the matrix
    products cost next to nothing: each engine's fixed cost per step (batch 1)."""
    model, hf = make_models(device, dtype, workdir / "tiny", d_model=64, n_heads=4, d_ff=256)
    ids = torch.randint(0, 50257, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(2))
    ids = ids.to(device)

    def run_zoo() -> object:
        return zoo.generate(model, ids, max_new_tokens=n_new, temperature=0)

    def run_hf() -> object:
        with torch.inference_mode():
            return hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )

    t_zoo, t_hf = median_times(run_zoo, run_hf, repeats, sync)
    note = "12 layers of width 64: the fixed cost per token"
    if device.type == "cuda":
        with eager_steps():
            eager = median_time(run_zoo, repeats, sync)
        note += f"; zoo without CUDA graphs: {eager / n_new * 1e3:.2f} ms"
    return (
        "per-step overhead, batch 1 (ms/token)",
        f"{t_zoo / n_new * 1e3:.2f}",
        f"{t_hf / n_new * 1e3:.2f}",
        f"{t_hf / t_zoo:.2f}x",
        note,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()

    import transformers

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n_new = args.new_tokens
    rows: list[tuple[str, str, str, str, str]] = []

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model, hf = make_models(device, dtype, workdir)
        param_bytes = sum(
            p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()
        )
        bandwidth = read_bandwidth(device, sync)
        roofline = bandwidth / param_bytes  # tokens/s at batch 1 if only weights were read

        gen = torch.Generator().manual_seed(1)
        for batch in (1, 8):
            ids = torch.randint(0, 50257, (batch, PROMPT_LEN), generator=gen).to(device)

            def run_zoo(ids=ids):
                return zoo.generate(model, ids, max_new_tokens=n_new, temperature=0)

            def run_hf(ids=ids):
                with torch.inference_mode():
                    return hf.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=n_new,
                        min_new_tokens=n_new,
                        do_sample=False,
                        eos_token_id=None,
                        pad_token_id=0,
                    )

            same = torch.equal(run_zoo(), run_hf())
            t_zoo, t_hf = median_times(run_zoo, run_hf, args.repeats, sync)
            zoo_tps, hf_tps = batch * n_new / t_zoo, batch * n_new / t_hf
            note = "identical tokens" if same else "tokens differ"
            if batch == 1:
                note += f"; {zoo_tps / roofline:.0%} of roofline ({roofline:.1f} tok/s)"
            if device.type == "cuda":
                with eager_steps():
                    t_eager = median_time(run_zoo, args.repeats, sync)
                note += f"; zoo without CUDA graphs: {batch * n_new / t_eager:.1f} tok/s"
            rows.append(
                (
                    f"greedy decode, batch {batch}, {PROMPT_LEN}+{n_new} tokens (tok/s)",
                    f"{zoo_tps:.1f}",
                    f"{hf_tps:.1f}",
                    f"{zoo_tps / hf_tps:.2f}x",
                    note,
                )
            )

        rows.append(step_overhead(device, dtype, workdir, n_new, args.repeats, sync))

        for batch, length in ((1, 128), (8, 512)):
            ids = torch.randint(0, 50257, (batch, length), generator=gen).to(device)
            with torch.inference_mode():
                t_zoo, t_hf = median_times(
                    lambda ids=ids: model(ids), lambda ids=ids: hf(ids).logits, args.repeats, sync
                )
            rows.append(
                (
                    f"prefill forward {batch} x {length} (ms)",
                    f"{t_zoo * 1e3:.0f}",
                    f"{t_hf * 1e3:.0f}",
                    f"{t_hf / t_zoo:.2f}x",
                    "speed-up over transformers",
                )
            )

        if device.type == "cpu" and dtype == torch.float32:
            zoo_t, hf_t = cold_start(workdir, args.repeats)
            rows.append(
                (
                    "cold start to first token, new process (s)",
                    f"{zoo_t:.2f}",
                    f"{hf_t:.2f}",
                    f"{zoo_t / hf_t:.2f}x",
                    "zoo time / transformers time (target <= 0.5x)",
                )
            )

    facts = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": args.dtype,
        "read bandwidth": f"{bandwidth / 1e9:.1f} GB/s",
        "weights read per token": f"{param_bytes / 1e6:.0f} MB",
        "repeats (median)": args.repeats,
    }
    lines = [
        "| measure | zoo | transformers | ratio | note |",
        "|---|---|---|---|---|",
        *[f"| {' | '.join(r)} |" for r in rows],
        "",
        "Machine: " + "; ".join(f"{k}: {v}" for k, v in facts.items()),
    ]
    table = "\n".join(lines)
    publish(
        table,
        title="Generation benchmark: gpt2-124m, zoo vs transformers",
        markdown=args.markdown,
    )
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
