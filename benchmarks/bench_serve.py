"""zoo serve under load: tokens/s and time to first token at several numbers of concurrent
clients, against ``transformers serve`` on the same weights, in the same run.

    python benchmarks/bench_serve.py --markdown benchmarks/RESULTS-serve.md
    python benchmarks/bench_serve.py --models shakespeare-byte --clients 1 8 --requests 8

For each model (``shakespeare-byte``, trained; ``gpt2-124m`` with random weights of its real
shape, saved with ``zoo.save``) each server is started in its own process, one at a time, and
sent the same requests: ``--requests`` completions of prompts cut from Tiny Shakespeare,
greedy, ``--max-tokens`` new tokens each, streamed (server-sent events read over plain HTTP
connections by one event loop), by 1, 4, 8 and 16 concurrent clients. Reported per level:
generated tokens per second of wall time (all requests), that as a multiple of one client's,
the time to the first text (p50, p95) and the whole request's latency (p50). The issue's bar:
zoo at 8 clients reaches >= 3x the tokens/s of the same requests sent one at a time.

``transformers serve`` runs from ``--transformers-python`` (it needs ``accelerate``, which zoo
does not), on the model converted to the Hugging Face layout (``zoo convert --to hf-gpt2``),
twice: as it starts by default, and with ``--continuous-batching``. A server that does not start is
reported with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from common import machine_facts, publish

import zoo
from zoo.loading import convert_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"


@dataclass(frozen=True)
class Result:
    """One request: seconds to its first text and to its end, tokens generated, its text."""

    first: float
    total: float
    tokens: int
    text: str


@dataclass(frozen=True)
class Level:
    """One number of concurrent clients over every round: each round's tokens per second
    (all tokens over the round's wall time) and every request's result."""

    clients: int
    rates: list[float]
    results: list[Result]

    @property
    def tokens_per_second(self) -> float:
        """The median round's."""
        return statistics.median(self.rates)


def prompts(n: int) -> list[str]:
    """``n`` prompts: runs of lines of Tiny Shakespeare, 20 to 60 characters."""
    lines = [line for line in SHAKESPEARE.read_text().splitlines() if len(line) > 12]
    found, i = [], 0
    while len(found) < n:
        text = lines[i] + "\n" + lines[i + 1]
        found.append(text[: 20 + (len(found) * 7) % 41])
        i += 37
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(command: list[str], port: int, log: Path, timeout: float = 300) -> Iterator[None]:
    """A server process, until it answers ``GET /v1/models`` on ``port``; stopped after."""
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"exited with {process.returncode}: {log.read_text()[-600:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"did not answer in {timeout:.0f} s: {log.read_text()[-600:]}")
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/v1/models")
                if connection.getresponse().status == 200:
                    break
            time.sleep(0.5)
        yield
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _body(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """The response body as it arrives (chunked transfer encoding undone)."""
    if not chunked:
        while data := await reader.read(65536):
            yield data
        return
    while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


async def complete(port: int, model: str, prompt: str, max_tokens: int) -> Result:
    """One streamed greedy completion, timed, over a plain HTTP/1.1 connection read by the
    event loop. (A lean client: the clients share the machine's cores with the server; one
    thread with an event loop and no client library costs the least.)"""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    start = time.perf_counter()
    first = None
    pieces, tokens, chunks = [], None, 0
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        status = await reader.readline()
        headers = b""
        while (line := await reader.readline()) not in (b"\r\n", b""):
            headers += line.lower()
        if b" 200 " not in status:
            raise RuntimeError(f"{status!r}: {(await reader.read(300))!r}")
        rest = b""
        async for data in _body(reader, b"transfer-encoding: chunked" in headers):
            *lines, rest = (rest + data).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        chunks += 1
                        pieces.append(choice["text"])
                        if first is None:
                            first = time.perf_counter() - start
    finally:
        writer.close()
    total = time.perf_counter() - start
    return Result(first if first is not None else total, total, tokens or chunks, "".join(pieces))


def load(port: int, model: str, texts: list[str], max_tokens: int, clients: int) -> Level:
    """Send every prompt, ``clients`` at a time; the rate is over the wall time of all."""

    async def run() -> list[Result]:
        gate = asyncio.Semaphore(clients)

        async def one(text: str) -> Result:
            async with gate:
                return await complete(port, model, text, max_tokens)

        return list(await asyncio.gather(*(one(text) for text in texts)))

    start = time.perf_counter()
    results = asyncio.run(run())
    wall = time.perf_counter() - start
    return Level(clients, [sum(r.tokens for r in results) / wall], results)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    name: str,
    port: int,
    model: str,
    texts: list[str],
    max_tokens: int,
    levels: list[int],
    rounds: int,
) -> list[Level]:
    """Every level ``rounds`` times, the levels taking turns within each round (so that a
    change in the machine's load hits every level alike)."""
    load(port, model, texts[:2], max_tokens, 2)  # warm-up: first calls, allocations
    found: dict[int, list[Level]] = {clients: [] for clients in levels}
    for _ in range(rounds):
        for clients in levels:
            level = load(port, model, texts, max_tokens, clients)
            print(f"  {name}: {clients} clients, {level.tokens_per_second:.1f} tok/s", flush=True)
            found[clients].append(level)
    return [
        Level(
            clients,
            [rate for level in runs for rate in level.rates],
            [result for level in runs for result in level.results],
        )
        for clients, runs in found.items()
    ]


def rows(model: str, server: str, levels: list[Level], reference: list[str]) -> list[str]:
    base = levels[0].tokens_per_second
    out = []
    for level in levels:
        firsts = [r.first * 1000 for r in level.results]
        texts = [r.text for r in level.results]
        same = sum(t == reference[i % len(reference)] for i, t in enumerate(texts))
        out.append(
            f"| {model} | {server} | {level.clients} | {level.tokens_per_second:.1f} | "
            f"{level.tokens_per_second / base:.2f}x | {percentile(firsts, 0.5):.0f} | "
            f"{percentile(firsts, 0.95):.0f} | "
            f"{statistics.median(r.total for r in level.results):.2f} | "
            f"{same}/{len(texts)} |"
        )
    return out


def scaling(levels: list[Level]) -> str:
    """8 clients' tokens/s over 1 client's: the median, and each round's (the two measured
    next to each other)."""
    by = {level.clients: level for level in levels}
    if 1 not in by or 8 not in by:
        return "(no 1- and 8-client levels)"
    rounds = [b / a for a, b in zip(by[1].rates, by[8].rates, strict=True)]
    each = ", ".join(f"{r:.2f}x" for r in rounds)
    median = by[8].tokens_per_second / by[1].tokens_per_second
    return f"at 8 clients: {median:.2f}x the tokens/s of 1 client (rounds: {each})"


def checkpoints(model: str, folder: Path) -> tuple[str, Path]:
    """What ``zoo serve`` serves (a name or a folder) and the model in the HF layout."""
    if model == "gpt2-124m":  # no official weights offline: random ones of the real shape
        torch.manual_seed(0)
        source = zoo.save(zoo.build("gpt2-124m"), folder / "zoo")
    else:
        source = model
    hf = convert_checkpoint(str(source), folder / "hf", to="hf-gpt2")
    return str(source), Path(hf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["shakespeare-byte", "gpt2-124m"])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--requests", type=int, default=16, help="per level (default: 16)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16, help="zoo serve's (default: 16)")
    parser.add_argument("--rounds", type=int, default=3, help="median over (default: 3)")
    parser.add_argument(
        "--transformers-python",
        default=sys.executable,
        help="the Python that runs transformers serve (with accelerate installed)",
    )
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--markdown", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    texts = prompts(args.requests)
    lines = [
        "| model | server | clients | tokens/s | vs 1 client | first text p50 (ms) | "
        "first text p95 (ms) | latency p50 (s) | same text as zoo alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            folder = Path(tmp) / model
            source, hf = checkpoints(model, folder)
            port = free_port()
            zoo_command = [sys.executable, "-m", "zoo.cli", "serve", source, "--port", str(port),
                           "--served-model-name", model, "--max-batch", str(args.max_batch),
                           "--log-level", "warning"]  # fmt: skip
            print(f"{model}: zoo serve", flush=True)
            with running(zoo_command, port, folder / "zoo.log"):
                levels = measure(
                    "zoo", port, model, texts, args.max_tokens, args.clients, args.rounds
                )
            reference = [r.text for r in levels[0].results[: len(texts)]]
            lines += rows(model, f"zoo serve (max batch {args.max_batch})", levels, reference)
            notes.append(f"{model}: zoo serve {scaling(levels)}")
            if args.no_transformers:
                continue
            for label, extra in (
                ("transformers serve", []),
                ("transformers serve --continuous-batching", ["--continuous-batching"]),
            ):
                port = free_port()
                command = [args.transformers_python, "-c",
                           "import sys; from transformers.cli.transformers import main; "
                           "sys.argv[0] = 'transformers'; sys.exit(main())",
                           "serve", str(hf), "--port", str(port), "--host", "127.0.0.1",
                           "--device", "cpu", *extra]  # fmt: skip
                print(f"{model}: {label}", flush=True)
                try:
                    with running(command, port, folder / "transformers.log"):
                        levels = measure(
                            label, port, str(hf), texts, args.max_tokens, args.clients, args.rounds
                        )
                except (RuntimeError, OSError) as exc:
                    notes.append(f"{model}: {label} did not run: {str(exc)[-400:]}")
                    continue
                lines += rows(model, label, levels, reference)
                notes.append(f"{model}: {label} {scaling(levels)}")
    facts = machine_facts("torch", "transformers", "fastapi", "uvicorn")
    report = "\n".join(
        [
            *lines,
            "",
            *[f"- {n}" for n in notes],
            "",
            f"{args.requests} requests per level, prompts of 20-60 characters of Tiny "
            f"Shakespeare, greedy, {args.max_tokens} new tokens each, streamed; tokens/s = all "
            f"generated tokens / wall time of the level, the median of {args.rounds} rounds "
            "(levels taking turns within a round); first-text and latency percentiles over "
            "every request of every round. 'same text' counts replies equal to zoo serve's "
            "at 1 client in the first round.",
            "",
            f"Machine: {facts}; torch threads {torch.get_num_threads()}; load average "
            f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after.",
        ]
    )
    publish(report, title="zoo serve under load", markdown=args.markdown)


if __name__ == "__main__":
    main()
