"""Before and after a change: decoding and training speed of an earlier commit against the
working tree, side by side in one run.

    python benchmarks/bench_before_after.py --before HEAD~5 [--after HEAD] --repeats 5 \\
        --markdown benchmarks/RESULTS-before-after.md

The earlier commit (and ``--after``, else the working tree) is checked out in a temporary git
worktree; every measurement is a fresh process that imports ``zoo`` (and its plugins) from one
tree or the other, the two trees alternating in every round so drift on a shared machine hits
both alike. Figures are medians
over rounds; the ratio is after / before (above 1: faster now).

- decoding: gpt2-124m with random weights (one checkpoint, written by the earlier commit and
  loaded by both), a 16-token prompt
  and 64 greedy steps through the model's decoding session, at batch 1 and batch 8 (tokens
  per second), and the prefill of 1 x 128 tokens (ms, the median of 9 calls);
- training: ``zoo.train`` on Tiny Shakespeare bytes with a small GPT-2 (4 layers, width 256,
  context 128, batch 8), time per step with the first steps excluded;
- serving: ``zoo serve`` on the same checkpoint, started from each tree, sent 16 streamed
  greedy completions of 32 tokens by 1 and by 8 concurrent clients (generated tokens per
  second of wall time; the client is ``bench_serve.py``'s).
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

from bench_serve import free_port, load, prompts, running
from common import machine_facts, publish

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"

DECODE = textwrap.dedent(
    """
    import json, sys, time, torch, zoo
    torch.manual_seed(0)
    model = zoo.load(sys.argv[1], tokenizer=False)
    out = {}
    with torch.no_grad():
        for batch in (1, 8):
            ids = torch.randint(0, 50257, (batch, 16))
            for timed in (False, True):  # the first run warms the kernels up
                session = model.start_decoding(ids, None, 64)
                tokens = session.prefill().argmax(-1)
                start = time.perf_counter()
                for _ in range(64):
                    tokens = session.step(tokens).argmax(-1)
                seconds = time.perf_counter() - start
            out[f"decode batch {batch} (tok/s)"] = batch * 64 / seconds
        ids = torch.randint(0, 50257, (1, 128))
        model(ids)
        times = []
        for _ in range(9):  # one call is too noisy to compare: the median of nine
            start = time.perf_counter()
            model(ids)
            times.append(time.perf_counter() - start)
        out["prefill 1x128 (ms)"] = sorted(times)[4] * 1e3
    print(json.dumps(out))
    """
)

TRAIN = textwrap.dedent(
    """
    import json, sys, tempfile, torch, zoo
    from zoo.train import TrainConfig, train
    size = dict(n_layers=4, d_model=256, n_heads=4, d_ff=1024, context_length=128,
                vocab_size=257, dropout=0.0)
    times = []
    for steps in (5, 25):  # time per step from the loop's own clock, warm-up excluded
        torch.manual_seed(0)
        config = TrainConfig(steps=steps, batch_size=8, warmup=2, eval_every=0, eval_batches=1)
        with tempfile.TemporaryDirectory() as out:
            result = train(zoo.build("gpt2-124m", **size), sys.argv[1], out, config=config,
                           tokenizer=zoo.tokenizer("byte"), log=None)
        times.append(result.seconds)
    print(json.dumps({"train step, small GPT-2 (ms)": (times[1] - times[0]) / 20 * 1e3}))
    """
)


def _site(tree: Path, into: Path) -> Path:
    """A folder that makes ``import zoo`` and ``import zoo_plugins`` read ``tree``."""
    into.mkdir(parents=True, exist_ok=True)
    for name, target in (("zoo", tree / "zoo"), ("zoo_plugins", tree / "plugins")):
        link = into / name
        if not link.exists():
            link.symlink_to(target)
    return into


def _run(code: str, site: Path, *args: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"a measurement failed ({site}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


SERVE = "import sys; from zoo.cli import main; sys.exit(main())"


def _serve(site: Path, checkpoint: Path, log: Path) -> dict[str, float]:
    """``zoo serve`` from one tree: tokens/s of 16 completions by 1 and by 8 clients."""
    port = free_port()
    command = [sys.executable, "-c", SERVE, "serve", str(checkpoint), "--port", str(port),
               "--served-model-name", "gpt2", "--max-batch", "8",
               "--log-level", "warning"]  # fmt: skip
    texts = prompts(16)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(site)  # read by the server process `running` starts
    try:
        with running(command, port, log):
            load(port, "gpt2", texts[:2], 32, 2)  # warm-up
            return {
                f"serve {clients} client{'s' * (clients > 1)} (tok/s)": load(
                    port, "gpt2", texts, 32, clients
                ).tokens_per_second
                for clients in (1, 8)
            }
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD", help="the git ref to compare against")
    parser.add_argument(
        "--after", help="a git ref to compare (default: the working tree, uncommitted changes too)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(work / "before"),
             args.before],
            check=True, capture_output=True,
        )  # fmt: skip
        try:
            after = ROOT
            if args.after:
                after = work / "after"
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(after),
                     args.after],
                    check=True, capture_output=True,
                )  # fmt: skip
            sites = {
                "before": _site(work / "before", work / "site-before"),
                "after": _site(after, work / "site-after"),
            }
            ckpt = work / "gpt2"
            _run(
                "import sys, torch, zoo; torch.manual_seed(0); "
                "zoo.save(zoo.build('gpt2-124m'), sys.argv[1]); print('{}')",
                sites["before"],  # (written by the older code, which the newer reads)
                str(ckpt),
            )
            rows: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
            for round_ in range(args.repeats):
                order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                for side in order:
                    for code, arg in ((DECODE, str(ckpt)), (TRAIN, str(DATA))):
                        for key, value in _run(code, sites[side], arg).items():
                            rows[side].setdefault(key, []).append(value)
                    served = _serve(sites[side], ckpt, work / f"serve-{side}.log")
                    for key, value in served.items():
                        rows[side].setdefault(key, []).append(value)
                print(f"round {round_ + 1}/{args.repeats} done", flush=True)
        finally:
            for tree in ("before", "after"):
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / tree)],
                    check=False, capture_output=True,
                )  # fmt: skip

    def short(ref: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", ref],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip

    after_name = f"{args.after} ({short(args.after)})" if args.after else "the working tree"
    lines = [
        "| measure | before | after | after / before |",
        "|---|---:|---:|---:|",
    ]
    for key in rows["after"]:
        before = statistics.median(rows["before"][key])
        after = statistics.median(rows["after"][key])
        faster = after / before if "tok/s" in key else before / after
        lines.append(f"| {key} | {before:.1f} | {after:.1f} | {faster:.2f}x as fast |")
    lines += [
        "",
        f"Before: {args.before} ({short(args.before)}); after: {after_name}. Medians of "
        f"{args.repeats} rounds, each measurement a fresh process, the two trees alternating. "
        f"Machine: {machine_facts('torch')}. Load average {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after the run.",
    ]
    publish(
        "\n".join(lines), title="Before and after: decoding, training and serving speed",
        markdown=args.markdown,
    )  # fmt: skip


if __name__ == "__main__":
    main()
