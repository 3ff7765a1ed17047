"""What ``zoo serve`` holds on this machine, and what a client sees beyond: streaming clients
served at once and their latency, requests queued before 429, slow connections alongside,
and 503 beyond the connection cap.

    python benchmarks/bench_serve_load.py --markdown benchmarks/RESULTS-serve-load.md
    python benchmarks/bench_serve_load.py --clients 1 8 72 --slow 0 1100

The server serves shakespeare-byte with its default options (``--max-batch 8``,
``--max-queue 64``, 10 s for a request's headers, the connection cap derived from the open-file
limit) in its own process, under ``ulimit -n 1024`` (what most systems give a process). Every
client is a streamed greedy completion of ``--max-tokens`` new tokens over a plain HTTP/1.1
connection, read by one event loop in this process (see bench_serve.py), on the same cores as
the server.

1. Clients at once: ``N`` clients send their request at the same moment. Per level: how many
   were answered 200, 429 (the engine's queue was full) or 503; the time to the first text and
   the whole latency of the 200s (p50, p95); tokens per second; and the most requests the
   server reported running and waiting (``/health``, polled every 50 ms).
2. Slow connections: ``S`` connections each send half a request head and then nothing (a client
   sending a header line every few seconds, between two lines); 1 s later, 8 streaming clients
   and a ``/health`` request. Per level: how many of the ``S`` the server still holds, has
   answered 503 or has closed; the ``/health`` time; the 8 clients' statuses and latency.
3. Beyond the cap: a second server with ``--max-connections 32``, and 48 clients at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import re
import resource
import shlex
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench_serve import complete, free_port, percentile, prompts, running
from common import machine_facts, publish

MODEL = "shakespeare-byte"
HALF_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@dataclass
class Outcome:
    """The requests of one level: each one's status (or the error) and the 200s' times."""

    statuses: Counter[str] = field(default_factory=Counter)
    firsts: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    running: int = 0
    waiting: int = 0

    def cell(self) -> str:
        """``200: 8, 429: 2`` in the order of the codes."""
        return ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))

    def times(self) -> str:
        """First text p50 / p95 (ms) | latency p50 / p95 (s) of the 200s."""
        if not self.firsts:
            return "- | -"
        firsts = [1000 * t for t in self.firsts]
        return (
            f"{percentile(firsts, 0.5):.0f} / {percentile(firsts, 0.95):.0f} | "
            f"{percentile(self.totals, 0.5):.2f} / {percentile(self.totals, 0.95):.2f}"
        )


async def one(port: int, text: str, max_tokens: int, outcome: Outcome) -> None:
    """One streamed completion; its status (or what went wrong) goes into ``outcome``."""
    try:
        result = await complete(port, MODEL, text, max_tokens)
    except RuntimeError as exc:  # bench_serve's client: the status line, then the body
        found = re.search(r"HTTP/1\.1 (\d{3})", str(exc))
        outcome.statuses[found.group(1) if found else "bad answer"] += 1
    except OSError as exc:
        outcome.statuses[errno.errorcode.get(exc.errno or 0, type(exc).__name__)] += 1
    else:
        outcome.statuses["200"] += 1
        outcome.firsts.append(result.first)
        outcome.totals.append(result.total)
        outcome.tokens += result.tokens


async def health(port: int) -> dict[str, int]:
    """``GET /health`` over a new connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
    finally:
        writer.close()
    found: dict[str, int] = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    return found


async def clients(port: int, texts: list[str], max_tokens: int) -> Outcome:
    """Every text's request at once, with ``/health`` polled meanwhile."""
    outcome = Outcome()
    done = asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):  # KeyError: a 503
                state = await health(port)
                outcome.running = max(outcome.running, state["running"])
                outcome.waiting = max(outcome.waiting, state["waiting"])
            await asyncio.sleep(0.05)

    poller = asyncio.create_task(poll())
    start = time.perf_counter()
    await asyncio.gather(*(one(port, text, max_tokens, outcome) for text in texts))
    outcome.wall = time.perf_counter() - start
    done.set()
    await poller
    return outcome


def at_once(port: int, n: int, texts: list[str], max_tokens: int) -> Outcome:
    """``n`` clients at the same moment (prompts taken in turn from ``texts``)."""
    return asyncio.run(clients(port, [texts[i % len(texts)] for i in range(n)], max_tokens))


def part_clients(port: int, levels: list[int], texts: list[str], max_tokens: int) -> list[str]:
    lines = [
        "| clients at once | answers | first text p50 / p95 (ms) | latency p50 / p95 (s) | "
        "tokens/s | most running / waiting |",
        "|---|---|---|---|---|---|",
    ]
    for n in levels:
        outcome = at_once(port, n, texts, max_tokens)
        rate = outcome.tokens / outcome.wall
        print(f"  {n} clients at once: {outcome.cell()}", flush=True)
        lines.append(
            f"| {n} | {outcome.cell()} | {outcome.times()} | {rate:.0f} | "
            f"{outcome.running} / {outcome.waiting} |"
        )
    return lines


@contextlib.contextmanager
def slow_connections(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections that each sent half a request head; closed after."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            socks.append(sock)
            with contextlib.suppress(OSError):
                sock.sendall(HALF_HEAD)
            sock.setblocking(False)  # for fate()
        yield socks
    finally:
        for sock in socks:
            sock.close()


def fate(sock: socket.socket) -> str:
    """What became of a slow connection: still ``held``, answered ``503``, or ``closed``."""
    try:
        data = sock.recv(64, socket.MSG_DONTWAIT | socket.MSG_PEEK)
    except BlockingIOError:
        return "held"
    except OSError:
        return "closed"
    return "503" if data.startswith(b"HTTP/1.1 503") else "closed"


def part_slow(port: int, levels: list[int], texts: list[str], max_tokens: int) -> list[str]:
    lines = [
        "| slow connections | held / 503 / closed after 1 s | /health (ms) | 8 clients' answers "
        "| first text p50 / p95 (ms) | latency p50 / p95 (s) |",
        "|---|---|---|---|---|---|",
    ]
    for n in levels:
        with slow_connections(port, n) as socks:
            time.sleep(1)
            fates = Counter(fate(sock) for sock in socks)
            start = time.perf_counter()
            asyncio.run(health(port))
            probe = 1000 * (time.perf_counter() - start)
            outcome = at_once(port, 8, texts, max_tokens)
        print(f"  {n} slow connections: {dict(fates)}, 8 clients: {outcome.cell()}", flush=True)
        lines.append(
            f"| {n} | {fates['held']} / {fates['503']} / {fates['closed']} | {probe:.0f} | "
            f"{outcome.cell()} | {outcome.times()} |"
        )
    return lines


def serve_command(port: int, files: int, threads: int | None, *options: str) -> list[str]:
    """``zoo serve`` under ``ulimit -n files`` (and ``OMP_NUM_THREADS=threads``)."""
    serve = [sys.executable, "-m", "zoo.cli", "serve", MODEL, "--port", str(port),
             "--log-level", "warning", *options]  # fmt: skip
    omp = f"export OMP_NUM_THREADS={threads} && " if threads else ""
    return ["bash", "-c", f"ulimit -n {files} && {omp}exec {shlex.join(serve)}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32, 72, 128, 256])
    parser.add_argument("--slow", nargs="+", type=int, default=[0, 500, 1100, 3000])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--files", type=int, default=1024, help="the server's ulimit -n")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="the server's OMP_NUM_THREADS (default: unset, torch takes every core; on a "
        "machine other work keeps busy, 1 avoids OpenMP's threads waiting on each other)",
    )
    parser.add_argument("--markdown", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(args.slow) + 2 * max(args.clients) + 256
    if soft < wanted:  # the slow connections are this process's files too
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    texts = prompts(64)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        print(f"zoo serve {MODEL} (defaults, ulimit -n {args.files})", flush=True)
        command = serve_command(port, args.files, args.threads)
        with running(command, port, Path(tmp) / "serve.log"):
            at_once(port, 2, texts, args.max_tokens)  # warm-up
            first = part_clients(port, args.clients, texts, args.max_tokens)
            second = part_slow(port, args.slow, texts, args.max_tokens)
            log = (Path(tmp) / "serve.log").read_text()
        port = free_port()
        print("zoo serve --max-connections 32", flush=True)
        command = serve_command(port, args.files, args.threads, "--max-connections", "32")
        with running(command, port, Path(tmp) / "capped.log"):
            at_once(port, 2, texts, args.max_tokens)
            capped = at_once(port, 48, texts, args.max_tokens)
            log += (Path(tmp) / "capped.log").read_text()
    trouble = [line for line in log.splitlines() if "Too many open files" in line or
               "Traceback" in line]  # fmt: skip
    facts = machine_facts("torch", "fastapi", "uvicorn")
    report = "\n".join(
        [
            f"## 1. Clients at once ({MODEL}, --max-batch 8, --max-queue 64)",
            "",
            *first,
            "",
            "## 2. Slow connections (each sent half a request head), then 8 clients",
            "",
            *second,
            "",
            "## 3. Beyond the connection cap (--max-connections 32), 48 clients at once",
            "",
            f"Answers: {capped.cell()}; first text p50 / p95 (ms) | latency p50 / p95 (s) of "
            f"the 200s: {capped.times()}.",
            "",
            f"Each client: one streamed greedy completion of {args.max_tokens} new tokens "
            "(prompts of 20-60 characters of Tiny Shakespeare); tokens/s = the 200s' tokens / "
            "the level's wall time. The server runs under `ulimit -n "
            f"{args.files}`, OMP_NUM_THREADS {args.threads or 'unset'}; its log holds "
            f"{len(trouble)} lines with 'Too many open files' or "
            "'Traceback'.",
            "",
            f"Machine: {facts}; load average {load_before[0]:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after (1-minute; "
            f"{statistics.mean(load_before):.1f} mean of 1/5/15 before).",
        ]
    )
    publish(report, title="zoo serve: what it holds, and beyond", markdown=args.markdown)


if __name__ == "__main__":
    main()
