"""The report of bench_serve.py: each server (a zoo serve setting, transformers serve or vLLM)
with what was measured on it, and the markdown tables made of them."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from serve_client import Level, Server, median, percentile
from serve_probes import Prefix, Stall

#: The peers that zoo serve's tokens/s are compared with.
CONTINUOUS = "transformers serve --continuous-batching"
VLLM = "vLLM (CPU)"
PEERS = (CONTINUOUS, VLLM)


@dataclass
class Served:
    """One server (a zoo serve setting, transformers serve or vLLM) and what was measured on
    it."""

    label: str
    server: Server
    model: str
    shown: str
    zoo: bool
    levels: dict[int, list[Level]] = field(default_factory=dict)
    stalls: list[Stall] = field(default_factory=list)
    prefixes: list[tuple[Prefix, Prefix]] = field(default_factory=list)
    failed: str | None = None
    #: Seconds each measurement waited for the machine to go idle (benchmarks.common.settle).
    settled: list[float] = field(default_factory=list)

    def merged(self, clients: int) -> Level:
        runs = self.levels[clients]
        return Level(
            clients,
            [rate for level in runs for rate in level.rates],
            [result for level in runs for result in level.results],
        )


def level_rows(model: str, served: list[Served], clients: list[int]) -> list[str]:
    first = next((s for s in served if s.levels), None)
    reference = [r.text for r in first.levels[clients[0]][0].results] if first else []
    out = []
    for s in served:
        if not s.levels:
            continue
        base = s.merged(clients[0]).tokens_per_second if clients[0] in s.levels else float("nan")
        for n in clients:
            if n not in s.levels:
                continue
            level = s.merged(n)
            firsts = [r.first * 1e3 for r in level.results]
            gaps = [g * 1e3 for r in level.results for g in r.gaps()] or [float("nan")]
            same = sum(r.text == reference[i % len(reference)] for i, r in enumerate(level.results))
            out.append(
                f"| {model} | {s.label} | {n} | {level.tokens_per_second:.1f} | "
                f"{level.tokens_per_second / base:.2f}x | {percentile(firsts, 0.5):.0f} | "
                f"{percentile(firsts, 0.95):.0f} | {percentile(gaps, 0.5):.0f} | "
                f"{percentile(gaps, 0.95):.0f} | "
                f"{median([r.total for r in level.results]):.2f} | {same}/{len(level.results)} |"
            )
    return out


def level_notes(model: str, served: list[Served], clients: list[int]) -> list[str]:
    """Each server's 8-client scaling and each zoo setting's tokens/s over each peer's
    (:data:`PEERS`: transformers serve with continuous batching, vLLM)."""
    notes = []
    for s in served:
        if 1 in s.levels and 8 in s.levels:
            rounds = [
                b.rates[0] / a.rates[0] for a, b in zip(s.levels[1], s.levels[8], strict=False)
            ]
            ratio = s.merged(8).tokens_per_second / s.merged(1).tokens_per_second
            each = ", ".join(f"{r:.2f}x" for r in rounds)
            notes.append(
                f"{model}: {s.label} at 8 clients: {ratio:.2f}x the tokens/s of 1 "
                f"client (rounds: {each})"
            )
    peers = [s for s in served if s.label in PEERS and s.levels]
    for peer in peers:
        for s in served:
            if not s.label.startswith("zoo") or not s.levels:
                continue
            ratios = [
                f"{s.merged(n).tokens_per_second / peer.merged(n).tokens_per_second:.2f}x"
                for n in clients
                if n in s.levels and n in peer.levels
            ]
            notes.append(
                f"{model}: {s.label} / {peer.label}, tokens/s at {clients} clients: "
                f"{', '.join(ratios)}"
            )
    return notes


def stall_rows(model: str, served: list[Served], streams: int, tokens: int) -> list[str]:
    out = []
    for s in served:
        if not s.stalls:
            continue
        ratios = [x.ratio for x in s.stalls]
        early = sum(x.ended_early for x in s.stalls)
        out.append(
            f"| {model} | {s.label} | {streams} | {tokens} | "
            f"{median([x.longest for x in s.stalls]) * 1e3:.0f} | "
            f"{median([x.median for x in s.stalls]) * 1e3:.0f} | {median(ratios):.1f}x | "
            f"{', '.join(f'{r:.1f}x' for r in ratios)} | "
            f"{median([x.long_first for x in s.stalls]) * 1e3:.0f} | {early} |"
        )
    return out


def prefix_rows(model: str, served: list[Served], tokens: int) -> list[str]:
    first = next((s for s in served if s.prefixes), None)
    out = []
    for s in served:
        if not s.prefixes or first is None:
            continue
        shared = [pair[0] for pair in s.prefixes]
        control = [pair[1] for pair in s.prefixes]
        pairs = zip(s.prefixes, first.prefixes, strict=False)
        same = [
            a == b
            for mine, theirs in pairs
            for x, y in zip(mine, theirs, strict=True)
            for a, b in zip(x.replies, y.replies, strict=True)
        ]
        out.append(
            f"| {model} | {s.label} | {tokens} | "
            f"{median([p.firsts[0] for p in shared]) * 1e3:.0f} | "
            f"{median([median(list(p.firsts[1:])) for p in shared]) * 1e3:.0f} | "
            f"{median([p.ratio for p in shared]):.2f}x | "
            f"{', '.join(f'{p.ratio:.2f}x' for p in shared)} | "
            f"{median([p.ratio for p in control]):.2f}x | {sum(same)}/{len(same)} |"
        )
    return out


LEVELS_HEAD = [
    "| model | server | clients | tokens/s | vs 1 client | first text p50 (ms) | "
    "first text p95 (ms) | inter-token p50 (ms) | inter-token p95 (ms) | latency p50 (s) | "
    "same text as the first server alone |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
STALL_HEAD = [
    "| model | server | streams | long prompt (tokens) | longest gap in its prefill (ms) | "
    "median gap (ms) | ratio (goal <= 5x) | rounds | long prompt's first text (ms) | "
    "streams ended before it |",
    "|---|---|---|---|---|---|---|---|---|---|",
]
PREFIX_HEAD = [
    "| model | server | prefix (tokens) | first text, request 1 (ms) | first text, requests "
    "2-n (ms) | ratio (goal <= 0.5x) | rounds | control: own prefixes | same text as the "
    "first server |",
    "|---|---|---|---|---|---|---|---|---|",
]


@dataclass
class Report:
    levels: list[str] = field(default_factory=lambda: list(LEVELS_HEAD))
    stalls: list[str] = field(default_factory=lambda: list(STALL_HEAD))
    prefixes: list[str] = field(default_factory=lambda: list(PREFIX_HEAD))
    notes: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    commands: list[str] = field(default_factory=list)


def sections(args: argparse.Namespace, report: Report) -> list[str]:
    """The tables of the parts run, each with what it measured."""
    rounds = f"the median of {args.rounds} round{'s' * (args.rounds > 1)}"
    parts = {
        "levels": [
            "## Throughput and latency by number of clients",
            "",
            *report.levels,
            "",
            f"{args.requests} prompts per level (sent again in turn where a level has more "
            f"clients), of 20-60 characters of Tiny Shakespeare, greedy, {args.max_tokens} new "
            f"tokens each, streamed; tokens/s = all generated tokens / wall time of the level, "
            f"{rounds}; first text, inter-token gaps (between one request's pieces of text) and "
            "latency: percentiles over every request of every round. 'same text' counts "
            "replies equal to the first server's at 1 client in the first round.",
            "",
        ],
        "stall": [
            f"## Stall: {args.streams} streams decoding while a long prompt arrives",
            "",
            *report.stalls,
            "",
            f"Each stream: {args.stream_tokens} greedy tokens (at most); the long prompt is sent "
            f"once each stream has sent {args.warm} pieces of text and asks {args.probe_tokens} "
            "tokens. Longest gap: the longest between two pieces of one stream's text that "
            "overlaps the long prompt's prefill (its sending to its first text); median gap: "
            f"over all the streams' gaps; each {rounds} (every round's ratio shown).",
            "",
        ],
        "prefix": [
            f"## Shared prefix: {args.prefix_requests} requests one after another",
            "",
            *report.prefixes,
            "",
            "Each request: a prefix of whole lines of Tiny Shakespeare, then 20-60 characters "
            f"of its own, {args.probe_tokens} new tokens. Ratio: requests 2-n's median time to "
            f"first text over request 1's, {rounds} (every round's shown); the control sends "
            "the same with a new prefix for each request. Every round's prefixes and long "
            "prompt are new to every server (lines of Tiny Shakespeare used once in the run).",
            "",
        ],
    }
    return [line for part, lines in parts.items() if part in args.parts for line in lines]
