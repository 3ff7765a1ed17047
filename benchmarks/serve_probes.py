"""Two probes of a serving engine, each against a server already running on a port:

- **stall**: ``streams`` greedy streams decode; once each has sent ``warm`` pieces of text, a
  long prompt arrives. Measured: the streams' longest gap between two pieces of text that
  overlaps the long prompt's prefill (from its sending to its first text), against the
  median of all their gaps. A server that prefills a prompt whole, between two decoding
  steps, stalls every stream for as long as the prefill takes; one that prefills in chunks
  alongside the decoding rows keeps the gaps near the median.
- **shared prefix**: ``n`` requests whose prompts start with the same long prefix (then short
  suffixes of their own) are sent one after another; the time to first text of requests
  2..n against the first's. A server that keeps the prefix's keys and values answers the
  later ones sooner. The control: the same with a prefix of its own for each request, so
  the ratio of the shared run means something.

Long texts are whole lines of Tiny Shakespeare measured in the model's tokens, each used by
one probe of one round only (a server with a prefix cache has seen nothing of them before).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise

from serve_client import SHAKESPEARE, Result, complete, median, prompts, within


class Corpus:
    """Texts of about ``n`` tokens: consecutive lines of Tiny Shakespeare, never the same line
    twice, each text ending on a line with words (so a suffix appended after it leaves the
    text's own tokens as they were)."""

    def __init__(self, count: Callable[[str], int]):
        self.count = count
        self.lines = SHAKESPEARE.read_text().splitlines()
        self.cursor = 0

    def take(self, n: int) -> str:
        """The next lines, as many as fit in ``n`` tokens (a line longer alone is skipped)."""
        start = end = self.cursor
        text = ""
        while end < len(self.lines):
            longer = "\n".join(self.lines[start : end + 1]) + "\n"
            if self.count(longer) > n:
                if text:
                    break
                start = end = end + 1  # nothing fits yet: start after this line
                continue
            end += 1
            if self.lines[end - 1].strip():  # ends on words: keep it
                text = longer
        if not text:
            raise ValueError(f"Tiny Shakespeare has no more lines for {n} tokens")
        self.cursor = start + text.count("\n")
        return text


@dataclass(frozen=True)
class RoundTexts:
    """The long texts of one round, the same for every server of that round."""

    long_prompt: str
    shared_prefix: str
    own_prefixes: tuple[str, ...]
    suffixes: tuple[str, ...]

    @classmethod
    def take(cls, corpus: Corpus, *, long_tokens: int, prefix_tokens: int, n: int) -> RoundTexts:
        return cls(
            corpus.take(long_tokens),
            corpus.take(prefix_tokens),
            tuple(corpus.take(prefix_tokens) for _ in range(n)),
            tuple(prompts(n)),
        )


@dataclass(frozen=True)
class Stall:
    """One stall probe: the streams' longest gap overlapping the long prompt's prefill, their
    median gap, the long prompt's time to first text, and how many streams had ended before
    that first text (then the longest gap may miss the stall: give the streams more tokens)."""

    longest: float
    median: float
    long_first: float
    ended_early: int

    @property
    def ratio(self) -> float:
        return self.longest / self.median if self.median > 0 else float("inf")


def stall(
    port: int,
    model: str,
    texts: list[str],
    long_prompt: str,
    *,
    stream_tokens: int,
    long_tokens: int = 4,
    warm: int = 8,
) -> Stall:
    """``len(texts)`` streams of ``stream_tokens``; once each has sent ``warm`` pieces of
    text, ``long_prompt`` (``long_tokens`` new tokens)."""

    async def run() -> tuple[list[Result], float, Result]:
        counts = [0] * len(texts)
        ready = asyncio.Event()

        def seen(i: int) -> Callable[[float], None]:
            def on_text(_: float) -> None:
                counts[i] += 1
                if min(counts) >= warm:
                    ready.set()

            return on_text

        streams = [
            asyncio.create_task(complete(port, model, text, stream_tokens, on_text=seen(i)))
            for i, text in enumerate(texts)
        ]
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait([waiting, *streams], return_when=asyncio.FIRST_COMPLETED)
        if not ready.is_set():  # a stream ended (or failed) before the others were warm
            waiting.cancel()
            results = await asyncio.gather(*streams)
            raise RuntimeError(
                f"a stream ended after {min(len(r.times) for r in results)} pieces of text, "
                f"before {warm}: give the streams more tokens"
            )
        long = await complete(port, model, long_prompt, long_tokens)
        return list(await asyncio.gather(*streams)), long.start, long

    results, sent, long = within(run())
    first = sent + long.first
    longest, gaps, early = 0.0, [], 0
    for result in results:
        arrivals = [result.start + t for t in result.times]
        gaps += result.gaps()
        for a, b in pairwise(arrivals):
            if b > sent and a < first:  # the gap overlaps the prefill
                longest = max(longest, b - a)
        early += arrivals[-1] <= first
    return Stall(longest, median(gaps), long.first, early)


@dataclass(frozen=True)
class Prefix:
    """One shared-prefix probe: each request's time to first text and its text."""

    firsts: tuple[float, ...]
    replies: tuple[str, ...]

    @property
    def ratio(self) -> float:
        """Requests 2..n's median time to first text over the first's."""
        return median(list(self.firsts[1:])) / self.firsts[0]


def one_after_another(port: int, model: str, prompts_: Iterator[str], max_tokens: int) -> Prefix:
    """Each prompt sent when the one before has ended."""

    async def run() -> list[Result]:
        return [await complete(port, model, prompt, max_tokens) for prompt in prompts_]

    results = within(run())
    return Prefix(tuple(r.first for r in results), tuple(r.text for r in results))


def shared_prefix(
    port: int, model: str, texts: RoundTexts, max_tokens: int
) -> tuple[Prefix, Prefix]:
    """The shared prefix's requests, then the control's (a prefix of its own each)."""
    shared = one_after_another(
        port, model, (texts.shared_prefix + suffix for suffix in texts.suffixes), max_tokens
    )
    control = one_after_another(
        port,
        model,
        (own + suffix for own, suffix in zip(texts.own_prefixes, texts.suffixes, strict=True)),
        max_tokens,
    )
    return shared, control
