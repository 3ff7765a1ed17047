"""What the serving benchmarks share: servers started in their own processes, a lean streaming
client that times every chunk, a level of concurrent clients (:func:`load`), prompts cut from
Tiny Shakespeare and percentiles.

The client is one event loop in the benchmark's process reading server-sent events over plain
HTTP/1.1 connections (no client library): the clients share the machine's cores with the
server, and one thread with no library on top costs the least.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
#: Seconds one measurement (a level, a probe) may take before it is given up (TimeoutError).
LIMIT = 900.0
T = TypeVar("T")
SHAKESPEARE = ROOT / "plugins" / "shakespeare" / "data" / "tinyshakespeare.txt"


@dataclass(frozen=True)
class Result:
    """One request: seconds to its first text and to its end, tokens generated, its text, and
    when each piece of text arrived (seconds after ``start``, a ``time.perf_counter()``)."""

    first: float
    total: float
    tokens: int
    text: str
    times: tuple[float, ...] = ()
    start: float = 0.0

    def gaps(self) -> list[float]:
        """Seconds between consecutive pieces of text (the inter-token latencies)."""
        return [b - a for a, b in pairwise(self.times)]


def within(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` in a new event loop; TimeoutError after :data:`LIMIT` seconds (a server
    that stops answering costs a bounded time, not the whole run)."""
    return asyncio.run(asyncio.wait_for(work, LIMIT))


def prompts(n: int) -> list[str]:
    """``n`` prompts: runs of lines of Tiny Shakespeare, 20 to 60 characters."""
    lines = [line for line in SHAKESPEARE.read_text().splitlines() if len(line) > 12]
    found, i = [], 0
    while len(found) < n:
        text = lines[i] + "\n" + lines[i + 1]
        found.append(text[: 20 + (len(found) * 7) % 41])
        i += 37
    return found


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    """The median, NaN for no values (a cell that prints as ``nan``, not a crash)."""
    return statistics.median(values) if values else float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A server process started with ``command`` that answers ``GET /v1/models`` on ``port``
    once ready; its output goes to ``log``."""

    command: list[str]
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )

    def wait_ready(self, timeout: float = 300) -> None:
        """Until the server answers; a RuntimeError with its log's end if it exits or takes
        longer than ``timeout`` seconds."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"exited with {self.process.returncode}: {self.log.read_text()[-600:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"did not answer in {timeout:.0f} s: {self.log.read_text()[-600:]}"
                )
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/v1/models")
                if connection.getresponse().status == 200:
                    return
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def running(command: list[str], port: int, log: Path, timeout: float = 300) -> Iterator[None]:
    """A server process, until it answers ``GET /v1/models`` on ``port``; stopped after."""
    server = Server(command, port, log)
    server.start()
    try:
        server.wait_ready(timeout)
        yield
    finally:
        server.stop()


def get_json(port: int, path: str) -> Any:
    """``GET path`` on the server at ``port``, its JSON answer (None for any other status)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return json.loads(answer.read()) if answer.status == 200 else None
    finally:
        connection.close()


async def _body(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """The response body as it arrives (chunked transfer encoding undone)."""
    if not chunked:
        while data := await reader.read(65536):
            yield data
        return
    while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


async def complete(
    port: int,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    on_text: Callable[[float], None] | None = None,
) -> Result:
    """One streamed greedy completion over a plain HTTP/1.1 connection read by the event loop,
    timed: when each piece of text arrived. ``on_text`` is called with each arrival's
    ``time.perf_counter()`` as it happens (to act while the request is still running)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    start = time.perf_counter()
    times: list[float] = []
    pieces, tokens = [], None
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
            now = time.perf_counter()
            *lines, rest = (rest + data).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        pieces.append(choice["text"])
                        times.append(now - start)
                        if on_text is not None:
                            on_text(now)
    finally:
        writer.close()
    total = time.perf_counter() - start
    return Result(
        times[0] if times else total,
        total,
        tokens or len(times),
        "".join(pieces),
        tuple(times),
        start,
    )


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
        return median(self.rates)


def load(port: int, model: str, texts: list[str], max_tokens: int, clients: int) -> Level:
    """Send every prompt, ``clients`` at a time; the rate is over the wall time of all."""

    async def run() -> list[Result]:
        gate = asyncio.Semaphore(clients)

        async def one(text: str) -> Result:
            async with gate:
                return await complete(port, model, text, max_tokens)

        return list(await asyncio.gather(*(one(text) for text in texts)))

    start = time.perf_counter()
    results = within(run())
    wall = time.perf_counter() - start
    return Level(clients, [sum(r.tokens for r in results) / wall], results)
