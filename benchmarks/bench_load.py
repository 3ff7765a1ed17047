"""Load benchmark: gpt2-124m from a local safetensors file, zoo vs transformers.

    python benchmarks/bench_load.py [--repeats 5] [--markdown benchmarks/RESULTS-load.md]

A random full-size GPT-2 (124,439,808 parameters) is written once with
``transformers.GPT2LMHeadModel.save_pretrained`` (safetensors, Hugging Face layout) and once
with ``zoo.save`` (zoo layout, same weights). Every measurement then runs in a fresh Python
process (cold process, warm page cache: the files were just written):

- wall time of the load call alone, and of ``import`` + load;
- peak resident memory (``VmHWM``) over a bare ``import torch`` process, right after loading
  and again after touching every weight (a sum over all parameters): zoo's CPU weights are
  memory-mapped, so pages are only read when used;
- medians over ``--repeats`` runs, and ratios against transformers.

Targets: no slower than transformers; peak memory at most 1.2x the checkpoint size.
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
import time
from pathlib import Path

from common import machine_facts, publish

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    case, path = sys.argv[1], sys.argv[2]

    def hwm_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    base = hwm_kib()
    t1 = time.perf_counter()
    if case == "torch":
        model = None
    elif case == "transformers":
        from transformers import GPT2LMHeadModel
        t1 = time.perf_counter()
        model = GPT2LMHeadModel.from_pretrained(path)
    else:
        import zoo
        t1 = time.perf_counter()
        kwargs = {"noverify": {"verify": False}, "verify": {"verify": True}}.get(
            case.rpartition("-")[2], {})
        model = zoo.load(path, tokenizer=case.endswith("tokenizer"), **kwargs)
    t2 = time.perf_counter()
    after_load = hwm_kib()
    if model is not None:
        with torch.no_grad():
            total = sum(float(p.float().sum()) for p in model.parameters())
    after_touch = hwm_kib()
    print(json.dumps({
        "import_s": t1 - t0, "load_s": t2 - t1, "total_s": t2 - t0,
        "torch_kib": base, "load_kib": after_load, "touch_kib": after_touch,
    }))
    """
)

CASES = {
    "transformers": ("transformers `GPT2LMHeadModel.from_pretrained(hf_dir)`", "hf"),
    "zoo-verify": ("`zoo.load(zoo_dir, verify=True)` (sha256 hashed every time)", "zoo"),
    "zoo": ("`zoo.load(zoo_dir)` (default: sha256 verified before, file unchanged)", "zoo"),
    "zoo-noverify": ("`zoo.load(zoo_dir, verify=False)`", "zoo"),
    "zoo-hf": ("`zoo.load(hf_dir)` (HF layout, no hash recorded)", "hf"),
    "zoo-tokenizer": ("`zoo.load(zoo_dir)` + tokenizer (default)", "zoo"),
}


def _run(case: str, path: Path, cache: Path) -> dict[str, float]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "ZOO_CACHE_DIR": str(cache),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _write_checkpoints(root: Path) -> tuple[Path, Path, int]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import zoo

    hf_dir, zoo_dir = root / "hf", root / "zoo"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(hf_dir)
    model = zoo.load(hf_dir)
    zoo.save(model, zoo_dir)
    return hf_dir, zoo_dir, (hf_dir / "model.safetensors").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--workdir", type=Path, help="where to write the checkpoints")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        t = time.perf_counter()
        hf_dir, zoo_dir, size = _write_checkpoints(Path(tmp))
        print(f"checkpoints written in {time.perf_counter() - t:.1f}s; file {size / 1e6:.1f} MB")
        dirs = {"hf": hf_dir, "zoo": zoo_dir}
        cache = Path(tmp) / "cache"
        time.sleep(2.5)  # zoo only remembers a verified file once its mtime has settled
        _run("zoo-verify", zoo_dir, cache)  # the first verification, remembered
        runs: dict[str, list[dict[str, float]]] = {c: [] for c in ("torch", *CASES)}
        for _ in range(args.repeats):  # interleaved, so drift hits every case alike
            runs["torch"].append(_run("torch", hf_dir, cache))
            for case, (_, where) in CASES.items():
                runs[case].append(_run(case, dirs[where], cache))

    def med(case: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[case])

    base_kib = med("torch", "torch_kib")
    ref_load = med("transformers", "load_s")
    mb = 1024 / 1e6
    lines = [
        f"Checkpoint: random full-size GPT-2 (124,439,808 parameters), `model.safetensors` "
        f"{size / 1e6:.1f} MB (float32). Medians of {args.repeats} fresh processes each; "
        f"peak RSS is VmHWM minus a bare `import torch` process ({base_kib * mb:.0f} MB).",
        "",
        "| load | load call (s) | vs transformers | import + load (s) | peak RSS after load "
        "(MB) | peak RSS after touching all weights (MB) | / checkpoint size |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case, (label, _) in CASES.items():
        load_s, total_s = med(case, "load_s"), med(case, "total_s")
        after_load = (med(case, "load_kib") - base_kib) * mb
        after_touch = (med(case, "touch_kib") - base_kib) * mb
        lines.append(
            f"| {label} | {load_s:.3f} | {load_s / ref_load:.2f}x | {total_s:.2f} | "
            f"{after_load:.0f} | {after_touch:.0f} | {after_touch * 1e6 / size:.2f}x |"
        )
    load_after = os.getloadavg()[0]
    lines += [
        "",
        f"Machine: {machine_facts('torch', 'transformers', 'safetensors')}. "
        f"Load average {load_before:.1f} before and {load_after:.1f} "
        "after the run (other jobs shared the machine: absolute times are noisy, the ratios "
        "come from interleaved runs).",
        "",
        "Reading the table: zoo's CPU weights are a copy-on-write memory map of the file, so "
        "loading reads nothing and peak memory after touching every weight is the file "
        "itself. `verify=True` is the cost of hashing 498 MB with sha256 (on a background "
        "thread, overlapping the model build); the default verifies a file once and then "
        "trusts it while its inode, size and mtime are unchanged. The tokenizer row adds "
        "loading the GPT-2 BPE (transformers' `from_pretrained` loads no tokenizer).",
    ]
    publish(
        "\n".join(lines),
        title="Load benchmark: gpt2-124m, zoo vs transformers",
        markdown=args.markdown,
    )


if __name__ == "__main__":
    main()
