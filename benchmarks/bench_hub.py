"""Hub benchmark: pull + load of gpt2-124m from a local Hub server, zoo vs transformers.

    python benchmarks/bench_hub.py [--repeats 5] [--markdown benchmarks/RESULTS-hub.md]

A random full-size GPT-2 (124,439,808 parameters) is written once with
``transformers.GPT2LMHeadModel.save_pretrained`` (``config.json``, ``generation_config.json``,
``model.safetensors``: what ``openai-community/gpt2`` holds in that layout) and served as the repo
``openai-community/gpt2`` by ``tests/hubserver.py``'s ``LocalHub`` on 127.0.0.1 (plain HTTP,
Xet off). Every measurement runs in a fresh Python process whose Hugging Face cache
(``HF_HOME``) and zoo cache are new and empty, pointed at the server through ``HF_ENDPOINT``:

- ``zoo.load("gpt2-124m")``: resolve ``main`` to a commit, fetch ``config.json`` and
  ``model.safetensors`` at that commit, convert the Hugging Face layout, verify the weights'
  sha256 against the Hub's LFS metadata (hashed while the model is assembled);
- ``zoo.pull("gpt2-124m")``: the same download and verification, no model;
- ``transformers.GPT2LMHeadModel.from_pretrained("openai-community/gpt2")``: its own download
  (no verification) and load;
- then the same load again in a fresh process on the now warm cache.

Reported: wall time of the call, of ``import`` + call, peak resident memory (``VmHWM``) over a
bare ``import torch`` process after the call and after touching every weight; medians over
``--repeats`` rounds (cases interleaved), ratios against transformers. Each child prints the
first logits of a fixed input so the two libraries are checked to load the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from common import machine_facts, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # LocalHub and the client environment helper

REPO = "openai-community/gpt2"
TOKEN = "hf_bench_token"

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    case = sys.argv[1]

    def hwm_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    base = hwm_kib()
    t1 = time.perf_counter()
    model = None
    if case == "torch":
        pass
    elif case.startswith("transformers"):
        from transformers import GPT2LMHeadModel
        t1 = time.perf_counter()
        model = GPT2LMHeadModel.from_pretrained("openai-community/gpt2")
    else:
        import zoo
        t1 = time.perf_counter()
        if case.startswith("zoo-pull"):
            zoo.pull("gpt2-124m")
        else:
            model = zoo.load("gpt2-124m")
    t2 = time.perf_counter()
    after_load = hwm_kib()
    head = []
    if model is not None:
        with torch.no_grad():
            total = sum(float(p.float().sum()) for p in model.parameters())
            out = model(torch.tensor([[15496, 995, 11, 6109, 3626]]))
            out = getattr(out, "logits", out)
            head = [float(x) for x in out[0, -1, :5]]
    after_touch = hwm_kib()
    print(json.dumps({
        "import_s": t1 - t0, "call_s": t2 - t1, "total_s": t2 - t0,
        "torch_kib": base, "load_kib": after_load, "touch_kib": after_touch, "head": head,
    }))
    """
)

#: case -> (label, cache state). Cold cases start from an empty cache; each warm case runs
#: right after its cold case, in the cache that one filled.
CASES = {
    "transformers": ("transformers `GPT2LMHeadModel.from_pretrained(repo)`", "cold"),
    "zoo": ('`zoo.load("gpt2-124m")` (sha256 verified)', "cold"),
    "zoo-pull": ('`zoo.pull("gpt2-124m")` (download + sha256, no model)', "cold"),
    "transformers-warm": ("transformers `from_pretrained(repo)`", "warm"),
    "zoo-warm": ('`zoo.load("gpt2-124m")`', "warm"),
}


def _unpinned_registry(home: Path) -> Path:
    """gpt2-124m as registry.toml has it, without the official sha256 pin: the local Hub
    serves random weights under the official repo id (chosen with ZOO_PREFER)."""
    text = (ROOT / "registry.toml").read_text()
    section = text[text.index("[models.gpt2-124m]") : text.index("[models.wiki-gpt-wordpiece]")]
    path = home / "unpinned.toml"
    kept = [line for line in section.splitlines() if not line.startswith("sha256")]
    path.write_text("\n".join(kept))
    return path


def _run(case: str, endpoint: str, home: Path) -> dict:
    from hub_fixtures import hub_client_env

    registry = _unpinned_registry(home)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))},
        **hub_client_env(endpoint, TOKEN, home),
        "ZOO_REGISTRY_PATH": str(registry),
        "ZOO_PREFER": str(registry),
        "ZOO_CACHE_DIR": str(home / "zoo"),
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _write_checkpoint(directory: Path) -> int:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(directory)
    return (directory / "model.safetensors").stat().st_size


def main() -> None:
    from hubserver import LocalHub

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--workdir", type=Path, help="where to write checkpoint and caches")
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {c: [] for c in ("torch", *CASES)}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp, LocalHub(token=TOKEN) as hub:
        t = time.perf_counter()
        size = _write_checkpoint(Path(tmp) / "hf")
        hub.add_files(REPO, {p.name: p for p in (Path(tmp) / "hf").iterdir()}, message="seed")
        shutil.rmtree(Path(tmp) / "hf")
        print(
            f"checkpoint written and served in {time.perf_counter() - t:.1f}s; {size / 1e6:.1f} MB"
        )
        for round_ in range(args.repeats):  # interleaved, so drift hits every case alike
            runs["torch"].append(_run("torch", hub.endpoint, Path(tmp) / "bare"))
            order = ["transformers", "zoo", "zoo-pull"]
            if round_ % 2:
                order.reverse()
            for case in order:
                home = Path(tmp) / f"home-{case}-{round_}"
                runs[case].append(_run(case, hub.endpoint, home))
                if f"{case}-warm" in CASES:
                    runs[f"{case}-warm"].append(_run(f"{case}-warm", hub.endpoint, home))
                shutil.rmtree(home)
            print(f"round {round_ + 1}/{args.repeats} done", flush=True)

    heads = {c: runs[c][0]["head"] for c in ("transformers", "zoo")}
    diff = max(abs(a - b) for a, b in zip(heads["transformers"], heads["zoo"], strict=True))
    if diff > 1e-4:
        raise SystemExit(f"zoo and transformers disagree on the logits ({diff:.3g})")

    def med(case: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[case])

    base_kib = med("torch", "torch_kib")
    mb = 1024 / 1e6
    lines = [
        f"Checkpoint: random full-size GPT-2 (124,439,808 parameters), `model.safetensors` "
        f"{size / 1e6:.1f} MB (float32), served as `{REPO}` by `LocalHub` on 127.0.0.1. "
        f"Medians of {args.repeats} fresh processes each; cold = empty `HF_HOME`; peak RSS is "
        f"VmHWM minus a bare `import torch` process ({base_kib * mb:.0f} MB). Logits of zoo "
        f"and transformers agree to {diff:.1e}.",
        "",
        "| cache | call | call (s) | vs transformers | import + call (s) | peak RSS after call "
        "(MB) | peak RSS after touching all weights (MB) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case, (label, state) in CASES.items():
        reference = "transformers" if state == "cold" else "transformers-warm"
        call_s, total_s = med(case, "call_s"), med(case, "total_s")
        after_load = (med(case, "load_kib") - base_kib) * mb
        after_touch = (med(case, "touch_kib") - base_kib) * mb
        touched = f"{after_touch:.0f}" if runs[case][0]["head"] else "-"
        lines.append(
            f"| {state} | {label} | {call_s:.2f} | {call_s / med(reference, 'call_s'):.2f}x | "
            f"{total_s:.2f} | {after_load:.0f} | {touched} |"
        )
    lines += [
        "",
        "What each call includes: zoo's resolves the revision (1 API call), reads the file "
        "metadata (1 API call), downloads `config.json` and `model.safetensors` at that commit, "
        "hashes the weights against the Hub's LFS sha256, and (`zoo.load`) builds the model on "
        "the meta device, assigns the memory-mapped tensors and attaches the GPT-2 tokenizer; "
        "its lazy `huggingface_hub` import is inside the call. transformers downloads and loads "
        "with no hash check and no tokenizer; its `huggingface_hub` import is in the import "
        "column. A warm zoo load hashes again (a just-downloaded file is only remembered as "
        "verified once its mtime has settled); later loads skip the hash.",
        "",
        f"Machine: {machine_facts('torch', 'transformers', 'huggingface_hub', 'safetensors')}.",
    ]
    publish(
        "\n".join(lines),
        title="Hub benchmark: pull + load gpt2-124m, zoo vs transformers",
        markdown=args.markdown,
    )


if __name__ == "__main__":
    main()
